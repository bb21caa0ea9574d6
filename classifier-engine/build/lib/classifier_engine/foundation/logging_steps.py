"""When Lightning's loggers write, asked in the same words by the model and by every callback that logs."""

from __future__ import annotations

import lightning as L


def at_logging_step(trainer: L.Trainer) -> bool:
    """Whether the logger writes this step, asked in ``on_train_batch_end`` after an optimizer step.

    Lightning's own answer (its logger connector's ``should_update_logs``) is private; this is the same
    rule from public attributes: ``global_step`` already counts the step just taken.
    """
    every = trainer.log_every_n_steps
    return every > 0 and (trainer.should_stop or trainer.global_step % every == 0)


def metrics_step(trainer: L.Trainer) -> int:
    """The step Lightning logs epoch-level metrics (``val/*``) at, so that figures and extra scalars line up.

    Lightning logs them at its count of optimizer steps taken before the current one, which is
    one less than ``trainer.global_step`` during training.
    """
    # Private, with no public route: the counter Lightning itself logs at (tests/test_private_routes.py).
    return trainer.fit_loop.epoch_loop._batches_that_stepped
