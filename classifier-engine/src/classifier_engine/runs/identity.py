"""What a run is: its resolved config (minus keys that cannot change results, see ``config_hash.py``)
plus what its data is (the data module's fingerprint), hashed with SHA-256; and how two configs differ.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config_hash import SHORT_LENGTH, canonical_config

# Settings that shape the weights (with everything under them, e.g. model.backbone.init_args.width):
# a checkpoint cannot continue under other values, even if allowed.
WEIGHT_SHAPING_KEYS = ("model.backbone", "data.dataset", "data.class_names")


@dataclass(frozen=True)
class RunIdentity:
    """The canonical config (with the data fingerprint) and its SHA-256."""

    canonical: str

    @classmethod
    def of(cls, resolved_config: dict[str, Any], data_fingerprint: str) -> RunIdentity:
        return cls(canonical_config({**resolved_config, "data_fingerprint": data_fingerprint}))

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.canonical.encode()).hexdigest()

    @property
    def short(self) -> str:
        return self.hash[:SHORT_LENGTH]

    def run_dir(self, parent: Path) -> Path:
        """The folder this identity's run has under ``parent`` (an experiment, or an evaluated run's stage)."""
        return Path(parent) / self.short

    def changes_from(self, other_canonical: str) -> dict[str, str]:
        return config_changes(json.loads(other_canonical), json.loads(self.canonical))


def config_changes(old: dict, new: dict, prefix: str = "") -> dict[str, str]:
    """``{dotted key: "old -> new"}`` for every leaf that differs between two configs."""
    changes = {}
    for key in sorted(set(old) | set(new)):
        before, after = old.get(key, "<unset>"), new.get(key, "<unset>")
        if isinstance(before, dict) and isinstance(after, dict):
            changes.update(config_changes(before, after, f"{prefix}{key}."))
        elif before != after:
            changes[f"{prefix}{key}"] = f"{json.dumps(before)} -> {json.dumps(after)}"
    return changes


def shapes_weights(key: str) -> bool:
    return any(key == shaping or key.startswith(f"{shaping}.") for shaping in WEIGHT_SHAPING_KEYS)


def describe(changes: dict[str, str]) -> str:
    return "; ".join(f"{key}: {change}" for key, change in changes.items())
