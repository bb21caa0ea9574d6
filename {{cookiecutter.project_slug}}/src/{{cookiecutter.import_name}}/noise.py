"""Known third-party messages that tell this project's users nothing, silenced precisely and in one place.

Each filter matches one message of one library, so every other warning stays visible.
"""

from __future__ import annotations

import logging
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
)
# Lightning's advertisements for its hosted services, logged at every start.
ADVERTISEMENT = "💡 Tip:"


class _DropAdvertisements(logging.Filter):
    @override
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(ADVERTISEMENT)


def silence_known_noise() -> None:
    """Install the filters (idempotent)."""
    for message, category in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(existing, _DropAdvertisements) for existing in rank_zero.filters):
        rank_zero.addFilter(_DropAdvertisements())
