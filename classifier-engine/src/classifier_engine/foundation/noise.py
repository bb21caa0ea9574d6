"""Known third-party messages that tell this project's users nothing, silenced precisely and in one place.

Each filter matches one message of one library, so every other warning stays visible.
"""

from __future__ import annotations

import logging
import os
import re
import warnings

from typing_extensions import override

# (message pattern, category): why it says nothing here
KNOWN_WARNINGS: tuple[tuple[str, type[Warning]], ...] = (
    # lightning 2.6 uses a torch pytree API that torch >= 2.10 deprecates, twice per fit
    (r".*isinstance\(treespec, LeafSpec\)", FutureWarning),
    # a resumed run writes into its own run directory's checkpoints/ by design
    (r"Checkpoint directory .* exists and is not empty", UserWarning),
    # validate/test/predict log inside the run, so the checkpoint callbacks' folder moves on purpose
    (r"The dirpath has changed from", UserWarning),
    # sweep.py hands each trial its own arguments while its own are in sys.argv, on purpose
    (r"LightningCLI's args parameter is intended to run from within Python", UserWarning),
    # the model's configure_model only compiles (it shards nothing), which the averaged copy does not need
    (r"You're using the WeightAveraging callback with a model that overrides the configure_model", UserWarning),
    # the training epoch's means are summed over every rank already (models/training_totals.py), once
    (r"It is recommended to use `self.log\('train/(loss_epoch|top1|top5)', \.\.\., sync_dist=True\)`", UserWarning),
    # litdata's streaming dataset shards over the loader's workers itself, so its length is exact
    (r"Your `IterableDataset` has `__len__` defined", UserWarning),
)
# Lightning's info lines that say nothing here: why each.
KNOWN_LINES = re.compile(
    r"💡 Tip:"  # advertisements for its hosted services, at every start
    # ModelCheckpoint's save on an exception, garbled ("An SIGTERMException was raised with message:    , saved
    # checkpoint to ..."); the project's own line says which checkpoint holds which step (ending.py)
    r"|An? \w+ was raised with message:"
)

# litdata's advice to cache at least 25 GB, at every start below it: data.max_cache_size is the user's choice
LITDATA_LINES = re.compile(r"The provided `max_cache_size` is less than")


class _DropKnownLines(logging.Filter):
    def __init__(self, pattern: re.Pattern[str] = KNOWN_LINES) -> None:
        super().__init__()
        self.pattern = pattern

    @override
    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.match(record.getMessage())


# What the resource tracker (a process of its own) says when loader workers from a fork server ended with their
# rank's os._exit (a rank stopped for another's fault): it removes their semaphores, as it should, and says so.
CHILD_WARNINGS = "ignore:resource_tracker:UserWarning"


def silence_known_noise() -> None:
    """Install the filters (idempotent)."""
    for message, category in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    inherited = [part for part in os.environ.get("PYTHONWARNINGS", "").split(",") if part]
    if CHILD_WARNINGS not in inherited:  # read by the processes this one starts, the resource tracker among them
        os.environ["PYTHONWARNINGS"] = ",".join([*inherited, CHILD_WARNINGS])
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(existing, _DropKnownLines) for existing in rank_zero.filters):
        rank_zero.addFilter(_DropKnownLines())
    streaming = logging.getLogger("litdata.streaming.dataset")
    if not any(isinstance(existing, _DropKnownLines) for existing in streaming.filters):
        streaming.addFilter(_DropKnownLines(LITDATA_LINES))
