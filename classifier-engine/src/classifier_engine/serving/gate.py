"""What stands before the API: load shed, a request's type and size checked, raw bytes turned into JSON.

An ASGI middleware on ``POST /predict``, which also answers ``GET /`` (the page to try the model, ``page.html``)
and ``GET /metrics`` itself (LitServe keeps ``/`` for a line of its own). Past the requests it lets wait, a new
one gets 503 (shed, not queued); a content type the API does not read gets 415, a body over the limit 413, JSON
that does not parse 400: each as ``{"error": "error: <what>; <what to do>"}``, and the server goes on serving.
Raw bytes (``image/*``, ``application/octet-stream``) reach the API as ``{"image": "<base64>"}``, so one decoder
serves every form.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Awaitable, Callable
from importlib.resources import files
from typing import Any

from .metrics import CONTENT_TYPE, RequestFigures

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

JSON = "application/json"
RAW = ("image/", "application/octet-stream")
FORM = "multipart/form-data"
DRAINED = 8  # a body over the limit is read to its end up to this many limits, then cut
PAGE = files(__package__).joinpath("page.html").read_bytes()
# The page loads nothing from elsewhere and posts only to this server; its script sets answers as text, not markup.
PAGE_POLICY = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src blob:; connect-src 'self'"
)


async def respond(send: Send, status: int, body: bytes, content_type: str, *more: tuple[bytes, bytes]) -> None:
    headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode()), *more]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def refuse(send: Send, status: int, what: str) -> None:
    """One JSON line, ``{"error": "error: ..."}``, with its status."""
    await respond(send, status, json.dumps({"error": f"error: {what}"}).encode(), JSON)


async def drain(receive: Receive, limit: int) -> None:
    """Read a refused request's body to its end (up to ``limit`` bytes): a server that answers and closes while
    the client still sends makes the client's system reset the connection, and the answer is lost with it."""
    size, more = 0, True
    while more and size <= limit:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        size += len(message.get("body", b""))
        more = message.get("more_body", False)


class RequestGate:
    """Checks ``path``'s POST requests before the API reads them (``max_bytes``: the largest body taken), and sheds
    load: past ``max_waiting`` requests in this server process at once, a new one gets 503 at once rather than
    a place in a queue without bound."""

    def __init__(
        self, app: Callable, path: str = "/predict", max_bytes: int = 20 * 1024 * 1024, max_waiting: int = 64
    ) -> None:
        self.app, self.path, self.max_bytes, self.max_waiting = app, path, max_bytes, max_waiting
        self.waiting = 0  # requests of this process between the gate and their answer
        self.figures = RequestFigures()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and scope["path"] in ("/", "/metrics"):
            if scope["path"] == "/":
                policy = (b"content-security-policy", PAGE_POLICY.encode())
                await respond(send, 200, PAGE, "text/html; charset=utf-8", policy)
            else:
                await respond(send, 200, self.figures.text(self.waiting).encode(), CONTENT_TYPE)
            return
        if scope["type"] != "http" or scope["path"] != self.path or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        started, status = time.monotonic(), [500]

        async def noted(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            if self.waiting >= self.max_waiting:
                await drain(receive, DRAINED * self.max_bytes)
                await refuse(noted, 503, f"the server is busy ({self.waiting} requests waiting); try again shortly")
                return
            self.waiting += 1
            try:
                await self.checked(scope, receive, noted)
            finally:
                self.waiting -= 1
        finally:
            self.figures.add(status[0], time.monotonic() - started)

    async def checked(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope["headers"])
        kind = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
        if not (kind in (JSON, FORM) or kind.startswith(RAW)):
            await drain(receive, DRAINED * self.max_bytes)
            await refuse(
                send,
                415,
                f"content type {kind or 'none'} is not read here; send the photo's bytes as "
                'image/jpeg (or image/png, ...), a multipart upload or JSON {"image": "<base64>"}',
            )
            return
        chunks: list[bytes] = []
        more, size = True, 0
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            more = message.get("more_body", False)
            if size <= self.max_bytes:
                chunks.append(chunk)
            elif not more or size > DRAINED * self.max_bytes:
                # Read to its end first (up to a bound) so that the client, still sending, reads the answer.
                await refuse(
                    send,
                    413,
                    f"the request is over this server's {self.max_bytes} bytes; send a smaller "
                    "photo or start the server with a larger --max_request_mb",
                )
                return
        body = b"".join(chunks)
        if kind.startswith(RAW):
            body, kind = json.dumps({"image": base64.b64encode(body).decode()}).encode(), JSON
        elif kind == JSON:
            try:
                json.loads(body)
            except (UnicodeDecodeError, json.JSONDecodeError):
                await refuse(send, 400, 'the body is not JSON; send {"image": "<base64 of the file>"}')
                return
        rest = [(name, value) for name, value in scope["headers"] if name not in (b"content-type", b"content-length")]
        if kind == JSON:
            rest += [(b"content-type", JSON.encode())]
        else:
            rest += [(b"content-type", headers[b"content-type"])]
        rest += [(b"content-length", str(len(body)).encode())]
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app({**scope, "headers": rest}, replay, send)
