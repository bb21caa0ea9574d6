"""What this command's training did, counted as it goes (``RunRecord``) and read by the CLI and the summary."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Session:
    """What this command's training did: counted by ``RunRecord``, read by the CLI and the summary."""

    first_step: int | None = None
    last_step: int = 0
    images: int = 0
    started: float = field(default_factory=time.perf_counter)
    stopped_by: BaseException | None = None  # what ended training early, as Lightning saw it
    diverged: str | None = None  # how, if training diverged

    @property
    def steps_taken(self) -> int:
        return self.last_step - self.first_step if self.first_step is not None else 0

    @property
    def trained(self) -> bool:
        """Whether this session has taken an optimizer step."""
        return self.steps_taken > 0

    @property
    def elapsed(self) -> float:
        """Seconds since this session's training started."""
        return time.perf_counter() - self.started
