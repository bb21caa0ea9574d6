"""Mistakes a user can fix, reported as one line: ``error: <what was wrong>; <what to do>``.

Exit code 2 for a wrong command or config (usage), 1 for a problem found while running
(a damaged file, no permission, a full disk). Set ``FULL_ERROR=1`` to get the traceback too.
"""

from __future__ import annotations

import errno
import os
import sys

DEBUG_VARIABLE = "FULL_ERROR"
USAGE, RUNTIME = 2, 1


class UserError(Exception):
    """Something the user can fix; the message says what was wrong and what to do."""

    exit_code = RUNTIME


class UsageError(UserError):
    """A wrong argument or config value, or a command that does not fit the runs on disk."""

    exit_code = USAGE


# Operating-system errors that mean "this place cannot be used", not a bug.
PLACE_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENOENT, errno.ENOTDIR}


def as_user_error(error: BaseException) -> UserError | None:
    """The user-facing form of ``error``, or None if it is not one a user can fix."""
    if isinstance(error, UserError):
        return error
    if isinstance(error, OSError) and error.errno in PLACE_ERRNOS and error.filename:
        return UserError(
            f"cannot use {error.filename}: {error.strerror}; choose a folder you can write to with room to spare "
            "(trainer.logger.init_args.save_dir, trainer.default_root_dir or data.data_dir)"
        )
    return None


def exit_with(error: BaseException) -> None:
    """Print ``error`` as one line and exit, unless it is a bug (or ``FULL_ERROR`` is set): then re-raise it."""
    user_error = as_user_error(error)
    if user_error is None or os.environ.get(DEBUG_VARIABLE, "") not in ("", "0"):
        raise error
    message = " ".join(line.strip() for line in str(user_error).splitlines() if line.strip())  # one line
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(user_error.exit_code) from None
