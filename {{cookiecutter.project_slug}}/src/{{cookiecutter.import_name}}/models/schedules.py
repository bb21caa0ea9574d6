"""Per-step learning-rate schedules that are planned from the config, never from a checkpoint.

``model.lr_schedule`` names one of the classes below by ``class_path`` (or class name); the
model builds it with the optimizer and the run's number of optimizer steps, the config gives
the rest. A schedule is a function of (step, total steps). Restored from a checkpoint it keeps only
its step count; the total comes from the current ``max_epochs``/``max_steps``. Extending a
finished run (``--trainer.max_epochs`` raised, ``--allow_config_change true``) therefore
continues on the schedule the longer run would have followed from its start, from the step
reached: a one-cycle or cosine run climbs back to where the longer plan is at that step and
anneals again to the new end, as timm's schedulers do when epochs are added. A resumed run
with an unchanged config follows exactly the same values as an uninterrupted one.
"""

from __future__ import annotations

{% if cookiecutter.dataset == "images" %}import math
{% endif %}import warnings
from collections.abc import Callable
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, LRScheduler, OneCycleLR
from typing_extensions import override

# What model.lr_schedule is: a scheduler class (or function) taking the optimizer and the run's total steps.
ScheduleFactory = Callable[[Optimizer, int], LRScheduler]


class Replanned(LRScheduler):
    """Mixin: checkpoint only the step; on restore, re-apply the configured hyperparameters at that step.

    Lightning restores the optimizer's param groups (learning rates, momentum, weight decay and
    the schedule's own keys) from the checkpoint before the scheduler. Those are the values of the
    config that wrote the checkpoint; an allowed config change must win, so the groups get back
    the values this run configured and the learning rate is recomputed for the restored step.
    """

    configured_groups: list[dict[str, Any]]

    def remember_configuration(self) -> None:
        self.configured_groups = [
            {key: value for key, value in group.items() if key != "params"} for group in self.optimizer.param_groups
        ]

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"last_epoch": self.last_epoch}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.resume_at(int(state_dict["last_epoch"]))

    def resume_at(self, step: int) -> None:
        """Put the configured hyperparameters back and move the schedule to ``step``."""
        for group, configured in zip(self.optimizer.param_groups, self.configured_groups, strict=True):
            group.update(configured)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # step(epoch) is deprecated, but the public way to jump
            self.step(min(step, self.last_step))

    @property
    def last_step(self) -> int:
        return 2**62


class PlannedLambdaLR(Replanned, LambdaLR):
    def __init__(self, optimizer: Optimizer, factor: Callable[[int], float]) -> None:
        super().__init__(optimizer, factor)
        self.remember_configuration()


class OneCycle(Replanned, OneCycleLR):
    """PyTorch's one-cycle policy over the run: warm up to the optimizer's lr, then anneal (momentum inversely)."""

    def __init__(self, optimizer: Optimizer, total_steps: int, warmup_fraction: float = 0.2) -> None:
        """Plan the cycle.

        Args:
            optimizer: The optimizer whose learning rate is the peak (given by the model).
            total_steps: Optimizer steps of the run (given by the model).
            warmup_fraction: Fraction of the steps spent warming up.
        """
        _check_fraction(warmup_fraction)
        total_steps = max(total_steps, 3)  # at least two warm-up steps and one after them
        warmup_steps = min(max(int(warmup_fraction * total_steps), 2), total_steps - 1)
        peak = [group["lr"] for group in optimizer.param_groups]
        super().__init__(optimizer, max_lr=peak, total_steps=total_steps, pct_start=warmup_steps / total_steps)
        self.remember_configuration()

    @property
    @override
    def last_step(self) -> int:
        return self.total_steps  # OneCycleLR refuses steps beyond its plan; a shortened run stops there


{% if cookiecutter.dataset == "images" %}class WarmupCosine(PlannedLambdaLR):
    """Linear warm-up from lr/warmup_steps to lr, then a cosine to 0 at the last step."""

    def __init__(self, optimizer: Optimizer, total_steps: int, warmup_fraction: float = 0.2) -> None:
        """Plan the schedule.

        Args:
            optimizer: The optimizer whose learning rate is the peak (given by the model).
            total_steps: Optimizer steps of the run (given by the model).
            warmup_fraction: Fraction of the steps spent warming up.
        """
        _check_fraction(warmup_fraction)
        super().__init__(optimizer, warmup_cosine(total_steps, int(warmup_fraction * total_steps)))


{% endif %}{% if cookiecutter.dataset != "images" %}class Triangle(PlannedLambdaLR):
    """Linear from start_factor x lr up to lr, then linear down to end_factor x lr at the last step (airbench)."""

    def __init__(
        self,
        optimizer: Optimizer,
        total_steps: int,
        warmup_fraction: float = 0.23,
        start_factor: float = 0.2,
        end_factor: float = 0.07,
    ) -> None:
        """Plan the schedule.

        Args:
            optimizer: The optimizer whose learning rate is the peak (given by the model).
            total_steps: Optimizer steps of the run (given by the model).
            warmup_fraction: Fraction of the steps spent climbing to the peak.
            start_factor: First step's learning rate as a fraction of the peak.
            end_factor: Last step's learning rate as a fraction of the peak.
        """
        _check_fraction(warmup_fraction)
        factor = triangle(total_steps, int(warmup_fraction * total_steps), start_factor, end_factor)
        super().__init__(optimizer, factor)


{% endif %}class Constant(PlannedLambdaLR):
    """The optimizer's learning rate at every step."""

    def __init__(self, optimizer: Optimizer, total_steps: int) -> None:
        """Keep the learning rate.

        Args:
            optimizer: The optimizer (given by the model).
            total_steps: Optimizer steps of the run (given by the model; unused).
        """
        super().__init__(optimizer, constant)


def _check_fraction(warmup_fraction: float) -> None:
    if not 0.0 <= warmup_fraction < 1.0:
        raise ValueError(f"model.lr_schedule.warmup_fraction must be in [0, 1), got {warmup_fraction}")


{% if cookiecutter.dataset != "images" %}def triangle(total_steps: int, peak_step: int, start: float, end: float) -> Callable[[int], float]:
    """Factor per step: linear from ``start`` to 1 at ``peak_step``, then to ``end`` at the last step."""

    def factor(step: int) -> float:
        if step < peak_step:
            return start + (1.0 - start) * step / peak_step
        return 1.0 + (end - 1.0) * min(step - peak_step, total_steps - peak_step) / max(total_steps - peak_step, 1)

    return factor


{% endif %}{% if cookiecutter.dataset == "images" %}def warmup_cosine(total_steps: int, warmup_steps: int) -> Callable[[int], float]:
    """Factor per step: linear from 1/warmup_steps to 1, then a cosine to 0 at the last step."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (1.0 + step * (warmup_steps - 1) / warmup_steps) / warmup_steps
        progress = min(step - warmup_steps, total_steps - warmup_steps) / max(total_steps - warmup_steps, 1)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


{% endif %}def constant(step: int) -> float:
    return 1.0
