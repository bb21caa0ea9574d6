"""Mistakes a user can fix, reported as one line: ``error: <what was wrong>; <what to do>``.

Exit code 2 for a wrong command or config (usage), 1 for a problem found while running
(a damaged file, no permission, a full disk). Set ``FULL_ERROR=1`` to get the traceback too.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import sys
from typing import Any, NoReturn, get_args

from typing_extensions import override

DEBUG_VARIABLE = "FULL_ERROR"
# Lines of jsonargparse's report that a one-line error leaves out.
PARSE_ERROR_NOISE = (
    "Expected a <class 'NoneType'>",
    "Does not validate against any of the Union subtypes",
    "Subtypes:",
    "Errors:",
    "Given value",
)
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


def full_error_wanted() -> bool:
    return os.environ.get(DEBUG_VARIABLE, "") not in ("", "0")


def parse_error_line(message: str) -> str:
    """jsonargparse's report on a bad option or config value, in one line: the full key and the innermost reason.

    The report nests one ``Parser key "...":`` section per level (``model.backbone``, then its
    ``depth``) and lists why each accepted type refused the value; the ``None`` of an optional value
    refusing it, the type list and the echoed value say nothing the line needs.
    """
    keys = re.findall(r'Parser key "([^"]+)":', message)
    if not keys:
        return " ".join(line.strip() for line in message.splitlines() if line.strip())
    innermost = message.rsplit(f'Parser key "{keys[-1]}":', 1)[1]
    reasons = []
    for line in innermost.splitlines():
        line = line.strip().removeprefix("- ")
        if line and not line.startswith(PARSE_ERROR_NOISE):
            line = re.sub(r"^Type .* expects a function or a callable class: ", "", line)
            reasons.append(re.sub(r"\. Got value: Namespace\(.*$", "", line))
    reason = "; ".join(reasons).replace(". Got value: ", ", got ").replace(":; ", ": ")
    reason = re.sub(r"Expected a typing\.Literal\[(.*?)\]", r"expected one of \1", reason)
    reason = re.sub(r"Expected a <class '(\w+)'>", r"expected \1", reason)
    # (a subclass's key is reported twice: the value itself, then wrapped as NestedArg(key=..., val=...))
    values = re.findall(r"^\s*Given value: (.*)$", message, re.MULTILINE)
    given = [value for value in values if "NestedArg(" not in value]
    if given and given[-1] not in reason:
        reason += f", got {given[-1]}"
    return f"{'.'.join(keys)}: {reason}"


def exit_with(error: BaseException) -> None:
    """Print ``error`` as one line and exit, unless it is a bug (or ``FULL_ERROR`` is set): then re-raise it."""
    user_error = as_user_error(error)
    if user_error is None or full_error_wanted():
        raise error
    message = " ".join(line.strip() for line in str(user_error).splitlines() if line.strip())  # one line
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(user_error.exit_code) from None


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse for the project's other commands (export.py, sweep.py): a bad option is one line, as in main.py.

    No abbreviations: an option of an earlier release (``--output``) must not be taken for a longer one
    (``--output_dir``) and quietly do something else.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, allow_abbrev=False, **kwargs)

    @override
    def error(self, message: str) -> NoReturn:
        print(f"error: {message}; see python {self.prog} --help", file=sys.stderr)
        raise SystemExit(USAGE)


def check_choice(key: str, value: object, choices: Any) -> None:
    """A constructor's check of a ``Literal``-typed value (Python callers bypass the CLI's), its values named once."""
    allowed = get_args(choices)
    if value not in allowed:
        names = ", ".join(map(str, allowed[:-1])) + f" or {allowed[-1]}"
        raise ValueError(f"{key} must be {names}, got {value!r}")
