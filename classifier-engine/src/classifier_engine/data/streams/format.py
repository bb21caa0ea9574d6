"""The on-store format of a streamed dataset: what ``pack.py`` writes and ``StreamedImageDataModule`` reads.

``<location>/<split>/`` holds a litdata dataset per split (``SPLITS``); ``<location>/dataset.json``
(``DATASET_FILE``), written last, says what the whole is: the format's version, the classes, the sizes and
the manifest's digest. A reader never needs the packer, and a half-written dataset has no record yet.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import DataError
from .object_store import join, read_text

DATASET_FILE = "dataset.json"
STREAM_FORMAT_VERSION = 1
SPLITS = ("train", "val", "test")


def read_record(location: str, options: dict[str, Any]) -> dict[str, Any] | None:
    """The ``dataset.json`` of a packed dataset at ``location``, or None when there is none (yet)."""
    text = read_text(location, DATASET_FILE, options)
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise DataError(f"{join(location, DATASET_FILE)} is not a dataset record ({error}); pack it again") from error
