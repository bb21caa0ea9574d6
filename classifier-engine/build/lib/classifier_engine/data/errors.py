"""What the data path raises: the data on disk, or a data setting, that cannot be used."""

from __future__ import annotations

from ..foundation.errors import UsageError, UserError


class DataError(UserError):
    """The data on disk cannot be used; the message says what is wrong and how to fix it."""


class DataSettingError(UsageError, DataError):
    """A data setting that does not fit the data (too large a split or batch, wrong class names)."""
