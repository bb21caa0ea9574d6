"""The server's parts that need no model: a card read as data, the gate before the API, and the answer rules."""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest

from classifier_engine.models.answers import UNKNOWN, UNLIKE_TRAINING, UNSURE, answers
from classifier_engine.serving.exported_model import ServingError, rules_of
from classifier_engine.serving.gate import RequestGate

CARD = {
    "task": "multiclass",
    "class_names": ["cat", "dog"],
    "calibration": {
        "task": "multiclass",
        "unknown": {"unlike_training": {"threshold": -1.5}, "likely_mistake": {"threshold": 0.6}},
    },
}


def test_a_card_s_rules_are_plain_values_of_their_kinds():
    rules = rules_of(CARD)
    assert rules.class_names == ("cat", "dog") and rules.unlike_training == -1.5 and rules.likely_mistake == 0.6
    crafted = [
        {**CARD, "class_names": "cat dog"},
        {**CARD, "class_names": ["cat", {"class_path": "os.system"}]},
        {**CARD, "calibration": {**CARD["calibration"], "unknown": {"unlike_training": {"threshold": "-1.5"}}}},
        {**CARD, "calibration": {**CARD["calibration"], "unknown": {"likely_mistake": {"threshold": True}}}},
        {**CARD, "calibration": {**CARD["calibration"], "unknown": {"likely_mistake": {"threshold": float("nan")}}}},
        {**CARD, "task": "multilabel", "calibration": {"task": "multilabel", "thresholds": [0.5]}},
        {**CARD, "calibration": {"task": "!!python/object"}},
        {**CARD, "calibration": {**CARD["calibration"], "unknown": ["unlike_training"]}},
        {**CARD, "calibration": {**CARD["calibration"], "unknown": {"likely_mistake": 0.6}}},
        {**CARD, "calibration": "softmax"},
    ]
    for card in crafted:
        with pytest.raises(ServingError, match="export"):
            rules_of(card)


def test_answers_say_unknown_and_why_as_predict_writes_them():
    probabilities = np.array([[0.9, 0.1], [0.55, 0.45], [0.8, 0.2]], dtype=np.float32)
    inside = np.array([True, True, False])
    found = answers(probabilities, ["cat", "dog"], inside, answered=np.array([True, False, False]), top_k=1)
    assert [a.cells()[:3] for a in found] == [
        ["cat", "0.9000", ""],
        [UNKNOWN, "0.5500", UNSURE],
        [UNKNOWN, "0.8000", UNLIKE_TRAINING],
    ]
    assert found[0].as_json()["top"] == [{"label": "cat", "probability": pytest.approx(0.9)}]
    several = answers(probabilities, ["cat", "dog"], inside, labels=probabilities >= 0.15)
    assert [a.as_json()["labels"] for a in several] == [["cat"], ["cat", "dog"], []]
    assert several[2].cells()[0] == UNKNOWN and several[2].unknown


def through_gate(body: bytes, content_type: str, max_bytes: int = 1000) -> tuple[int, dict | None, dict | None]:
    """(status, the JSON the gate answered, the request the API would have read) for one POST /predict."""
    seen: dict = {}

    async def api(scope, receive, send) -> None:
        message = await receive()
        seen["headers"] = dict(scope["headers"])
        seen["body"] = message["body"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    sent: list = []
    chunks = [body[i : i + 300] for i in range(0, len(body), 300)] or [b""]
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive() -> dict:
        return messages.pop(0)

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "path": "/predict",
        "method": "POST",
        "headers": [(b"content-type", content_type.encode())],
    }
    asyncio.run(RequestGate(api, max_bytes=max_bytes)(scope, receive, send))
    status = sent[0]["status"]
    answered = json.loads(sent[1]["body"]) if status != 200 else None
    return status, answered, seen or None


def test_the_gate_refuses_what_the_api_cannot_read_and_hands_raw_bytes_on_as_json():
    status, _, seen = through_gate(b"\xff\xd8 jpeg bytes", "image/jpeg")
    assert status == 200 and seen["headers"][b"content-type"] == b"application/json"
    assert base64.b64decode(json.loads(seen["body"])["image"]) == b"\xff\xd8 jpeg bytes"
    for body, kind, expected in [
        (b"x", "text/plain", 415),
        (b"x" * 2000, "image/png", 413),
        (b"{not json", "application/json", 400),
    ]:
        status, answered, seen = through_gate(body, kind)
        assert status == expected and seen is None  # the API never saw it
        assert list(answered) == ["error"] and answered["error"].startswith("error: ")


def test_past_the_requests_it_lets_wait_the_gate_sheds_a_new_one_with_503_and_takes_the_next_once_one_ends():
    release = asyncio.Event()

    async def api(scope, receive, send) -> None:  # a busy worker: answers when released
        await receive()
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    gate = RequestGate(api, max_waiting=2)
    scope = {"type": "http", "path": "/predict", "method": "POST", "headers": [(b"content-type", b"image/png")]}

    async def one_request() -> int:
        sent: list = []

        async def receive() -> dict:
            return {"type": "http.request", "body": b"png", "more_body": False}

        async def send(message: dict) -> None:
            sent.append(message)

        await gate(scope, receive, send)
        if sent[0]["status"] == 503:
            assert json.loads(sent[1]["body"])["error"].startswith("error: the server is busy")
        return sent[0]["status"]

    async def scenario() -> list[int]:
        waiting = [asyncio.create_task(one_request()) for _ in range(2)]
        await asyncio.sleep(0.01)
        shed = await one_request()  # two wait already: shed at once, not queued
        release.set()
        answered = await asyncio.gather(*waiting)
        return [shed, *answered, await one_request()]

    assert asyncio.run(scenario()) == [503, 200, 200, 200]
    assert gate.waiting == 0
    text = gate.figures.text(gate.waiting)
    assert 'classifier_requests_total{status="200"} 3' in text and 'classifier_requests_total{status="503"} 1' in text
    assert 'classifier_request_seconds_bucket{le="+Inf"} 4' in text and "classifier_request_seconds_count 4" in text
