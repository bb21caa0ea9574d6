"""Check a search space on the real parser before any trial: every key exists, every end and choice is valid."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from typing_extensions import override

from ..cli.trainer_cli import TrainerCLI
from ..foundation.errors import UsageError
from .space import SweepSpec, as_options


class _ParseOnly(TrainerCLI):
    """The fit command's parser and its checks of every value; nothing is built, seeded or written."""

    @override
    def _set_seed(self) -> None:
        pass

    @override
    def instantiate_classes(self) -> None:
        pass


def check_space(
    spec: SweepSpec, fit_options: list[str], model_class: type[L.LightningModule], default_config: Path
) -> None:
    """Parse the fit options with each probe of the space (see ``SweepSpec.probes``); a refusal names the key."""
    for values in spec.probes():
        try:
            _ParseOnly(model_class, default_config=default_config, args=[*fit_options, *as_options(values)], run=False)
        except UsageError as error:  # the fit parser's line, which names the key; its options are main.py fit's
            message = str(error).replace("see sweep.py --help", "see python main.py fit --help")
            raise UsageError(f"sweep file {spec.path}: {message}") from None
