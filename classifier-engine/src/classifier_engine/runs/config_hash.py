"""Name a run by what it computes: a SHA-256 of its resolved config, minus keys that cannot change results.

Two commands that differ only in where files go, how fast data is read or how often
progress is printed describe the same computation, so they share a hash (and a run
directory). Everything else — model, data, optimizer, trainer settings, seed — is in it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

SHORT_LENGTH = 12

# Switches that steer how a command starts, never what it computes: a job script that passes them
# and the same command typed by hand without them name the same run.
LAUNCH_SWITCHES: tuple[str, ...] = (
    "ckpt_path",  # where to resume from; a resumed run continues the same computation
    "allow_config_change",  # permission to resume under a changed config, not a setting of the run
    "allow_fresh_start",  # permission to start when there is nothing to resume yet
)
# Dotted keys left out of the hash; "*" matches any list index. Why each cannot change results:
EXCLUDED_KEYS: tuple[str, ...] = (
    "config",  # the config files' paths; their content is in the rest of the config
    *LAUNCH_SWITCHES,
    "safety",  # when last.ckpt is also written and which signal asks for a requeue: the same computation
    "trainer.default_root_dir",  # output location
    "trainer.logger",  # where and to which trackers metrics go (TensorBoard, MLflow, W&B), never what is computed
    "trainer.callbacks.*.init_args.dirpath",  # checkpoint location
    "verbose",  # validate/test print their metrics (console output only); fit has no such switch
    "return_predictions",  # predict keeps its outputs in memory as well; what it computes is the same
    "trainer.enable_progress_bar",  # console output only
    "trainer.enable_model_summary",  # console output only
    "trainer.log_every_n_steps",  # logging cadence only
    "data.init_args.data_dir",  # where the archive is; its content is pinned by the MD5 check
    "data.init_args.image_dir",  # where your images are; what they are is the manifest's digest (the fingerprint)
    "data.init_args.cache_dir",  # where the packed copy is kept
    "data.init_args.pack_workers",  # how many processes decode the same images
    "data.init_args.on_bad_image",  # which bad files stop packing; those kept are the manifest's
    "data.init_args.num_workers",  # how many processes read the same batches
    "data.init_args.pin_memory",  # how batches are copied, not what they hold
    "data.init_args.storage",  # where the same batches are gathered (memory map or device); they are identical
)
# Settings added after 1.0, each at the value that computes what 1.0 computed: left out of the hash at that
# value, so a run of an earlier 1.x release keeps its name (and resumes) under this one.
ADDED_SINCE_1_0: dict[str, Any] = {
    "model.class_weights": None,
    "model.loss": None,
    "model.keep_correct": 0.95,
    "model.keep_in_domain": 0.95,  # the "unlike the training images" threshold, fitted after each validation
    "data.init_args.task": "auto",
    "data.init_args.sampler": "shuffle",
    "data.init_args.allow_paths_outside": False,  # true is recorded: such a run read files outside its list's folder
    "data.init_args.source": None,  # a folder DataModule packing its image_dir, as before 1.4
    "data.init_args.pool_val": False,  # cross-validation over the training images alone, as before 1.4
    "recipe": "finetune",  # fit --recipe (1.6): the config's own recipe, as before
}
# Settings whose default changed without changing what is trained: each of these values names the run as the
# setting left unset did. ``reject_with`` chooses which fitted threshold answers "unknown" (1.0-1.3: msp; since
# 1.4: knn); every score's threshold is fitted after each validation whichever is chosen.
UNSET_AS: dict[str, tuple[Any, ...]] = {
    "model.reject_with": ("msp", "knn"),
}
# Keys left out when another key is unset: they apply only beside it.
ONLY_WITH: dict[str, str] = {
    "data.init_args.storage_options": "data.init_args.source",  # a folder DataModule's, used only to stream
    "data.init_args.max_cache_size": "data.init_args.source",
}
# Keys left out when another key, set, replaces them (what is left is what the run computes with).
REPLACED_BY: dict[str, str] = {
    # the per-device batch then follows from the global one
    "data.init_args.batch_size": "data.init_args.global_batch_size",
}


def _drop(node: Any, parts: list[str]) -> None:
    head, rest = parts[0], parts[1:]
    if head == "*" and isinstance(node, list):
        children = node
    elif isinstance(node, dict) and head in node:
        if not rest:
            del node[head]
            return
        children = [node[head]]
    else:
        return
    for child in children:
        if rest:
            _drop(child, rest)


def _value(node: Any, parts: list[str]) -> Any:
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def canonical_config(config: dict[str, Any], excluded: Iterable[str] = EXCLUDED_KEYS) -> str:
    """The config as sorted, compact JSON with the excluded keys removed."""
    pruned = json.loads(json.dumps(config))
    for key, replacement in REPLACED_BY.items():
        if _value(pruned, replacement.split(".")) is not None:
            _drop(pruned, key.split("."))
    for key, beside in ONLY_WITH.items():
        if _value(pruned, beside.split(".")) is None:
            _drop(pruned, key.split("."))
    for key in excluded:
        _drop(pruned, key.split("."))
    for key, value in ADDED_SINCE_1_0.items():
        if _value(pruned, key.split(".")) == value:
            _drop(pruned, key.split("."))
    for key, values in UNSET_AS.items():
        if _value(pruned, key.split(".")) in values:
            _drop(pruned, key.split("."))
    return json.dumps(pruned, sort_keys=True, separators=(",", ":"), default=str)
