"""The LitServe API of an exported model: an image in a request, ``predict``'s answer out, batched dynamically.

A request carries one image: raw bytes (``image/*`` or ``application/octet-stream``, which ``gate.py`` turns into
the JSON form), a multipart upload (field ``image``) or JSON ``{"image": "<base64>"}``. The worker decodes it by
the card's preprocessing record with the code ``predict`` decodes files with, stacks the waiting requests into
one batch (up to ``max_batch_size``, waiting at most ``batch_timeout``), runs the graph once and answers each.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path
from typing import Any

import litserve as ls
import numpy as np
from fastapi import HTTPException

from .exported_model import BadImageError, ExportedModel


def bad_request(what: str, status: int = 400) -> HTTPException:
    return HTTPException(status_code=status, detail=f"error: {what}")


def image_bytes(request: Any) -> bytes:
    """The image a request carries, as the file's bytes; a request that carries none is refused in one line."""
    if isinstance(request, dict):
        encoded = request.get("image")
        if not isinstance(encoded, str):
            raise bad_request('the JSON has no "image" string; send {"image": "<base64 of the file>"}')
        encoded = encoded.split(",", 1)[1] if encoded.startswith("data:") else encoded  # a data: URL
        try:
            return base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise bad_request('"image" is not base64; send the file\'s bytes base64-encoded') from None
    upload = request.get("image") if hasattr(request, "get") else None
    if upload is None or not hasattr(upload, "file"):
        raise bad_request('the form has no file field "image"; upload the photo as image=@photo.jpg')
    return upload.file.read()


class ClassifierAPI(ls.LitAPI):
    """One exported folder served: ``setup`` opens its graph once per worker."""

    def __init__(self, folder: Path, file: str, top_k: int, threads: int | None, **batching: Any) -> None:
        super().__init__(**batching)
        self.folder, self.file, self.top_k, self.threads = folder, file, top_k, threads
        self.model: ExportedModel | None = None

    def setup(self, device: str) -> None:
        self.model = ExportedModel(self.folder, self.file, self.threads)

    def decode_request(self, request) -> np.ndarray:  # unannotated: LitServe then hands over the parsed body
        try:
            return self.model.pixels(image_bytes(request))
        except BadImageError as error:
            raise bad_request(f"not an image this model can read ({error}); send a JPEG, PNG, WebP, ...") from None

    def batch(self, inputs: list[np.ndarray]) -> np.ndarray:
        return np.stack(inputs)

    def predict(self, x: np.ndarray) -> list:
        single = x.ndim == 3  # max_batch_size 1: LitServe passes one image, unbatched
        found = self.model.answer(x[None] if single else x, self.top_k)
        return found[0] if single else found

    def unbatch(self, output: list) -> list:
        return output

    def encode_response(self, output: Any) -> dict:
        return output.as_json()
