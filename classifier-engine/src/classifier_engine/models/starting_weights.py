"""Whether a network being built will take its weights from a checkpoint, so its starting weights are not needed.

A command that loads a checkpoint (``validate``, ``test``, ``predict``, ``export.py``) builds the model from the
config and then copies the checkpoint's weights in: a pretrained network's own weights would be read (from the
hub, or the file ``weights_path`` names) only to be overwritten. A network asks ``weights_from_checkpoint()``
and skips them, so such a command needs neither the network nor the file. The constructor arguments that only
choose starting weights are declared on the class (``starting_weights_arguments``), and a checkpoint's values
for them are never taken: they are the training machine's, not the model's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_FROM_CHECKPOINT: ContextVar[bool] = ContextVar("weights_from_checkpoint", default=False)
# The class attribute that names a network's constructor arguments choosing only its starting weights.
STARTING_WEIGHTS_ATTRIBUTE = "starting_weights_arguments"


def weights_from_checkpoint() -> bool:
    """True while a command builds a model whose weights a checkpoint will replace: skip loading pretrained ones."""
    return _FROM_CHECKPOINT.get()


@contextmanager
def building_for_checkpoint(active: bool = True) -> Iterator[None]:
    """Build models inside this block knowing a checkpoint's weights will replace theirs (``active``: whether so)."""
    token = _FROM_CHECKPOINT.set(active)
    try:
        yield
    finally:
        _FROM_CHECKPOINT.reset(token)


def starting_weights_arguments(cls: type) -> tuple[str, ...]:
    """The constructor arguments ``cls`` declares as choosing only its starting weights (none if it declares none)."""
    declared = getattr(cls, STARTING_WEIGHTS_ATTRIBUTE, ())
    return tuple(name for name in declared if isinstance(name, str)) if isinstance(declared, tuple | list) else ()
