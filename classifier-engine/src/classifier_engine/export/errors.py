"""What an export raises: a request it cannot carry out, or an artifact that failed a check."""

from __future__ import annotations

from ..foundation.errors import UsageError, UserError


class ExportError(UsageError):
    """The export cannot proceed as asked; the message says what is wrong and how to fix it."""


class ExportCheckError(UserError):
    """An artifact failed a check (parity, accuracy); the message says by how much and what to try."""


class Int8DropError(ExportCheckError):
    """The int8 model loses more than the limit against fp32; ``drop`` and ``limit`` in points."""

    def __init__(self, message: str, drop: float, limit: float) -> None:
        super().__init__(message)
        self.drop, self.limit = drop, limit
