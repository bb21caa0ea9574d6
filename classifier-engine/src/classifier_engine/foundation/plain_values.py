"""Plain data checked against a declared type by ``isinstance`` alone: never converted, never parsed.

For values from files of unknown origin (a checkpoint's settings, a record beside packed images): a number,
a boolean, ``None``, a string of a ``Literal`` or one that is only a name, and lists, tuples and string-keyed
dicts of those. Nothing here imports, opens or interprets what a value says.
"""

from __future__ import annotations

import collections.abc
import math
import re
import types
import typing
from typing import Any, Literal, Union

# A string used only as a name: no path separator, no drive or URL scheme, no YAML or shell punctuation.
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+\- ]{0,199}")
MAX_ITEMS = 1_000_000  # items of any list or dict a file gives one value
Strings = Literal["any", "names", "literals"]


def _members(annotation: Any) -> tuple[Any, ...]:
    """The types a union admits (a single type: itself)."""
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _is_none(annotation: Any) -> bool:
    return annotation is None or annotation is type(None)


def is_plain_type(annotation: Any) -> bool:
    """Whether every value of ``annotation`` is plain data: no class, callable, path or untyped member."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        return all(is_plain_type(member) for member in typing.get_args(annotation))
    if origin is Literal:
        return all(isinstance(item, str | int | float | bool) or item is None for item in typing.get_args(annotation))
    if _is_none(annotation) or annotation in (bool, int, float, str):
        return True
    if origin in (list, tuple, collections.abc.Sequence, dict, collections.abc.Mapping):
        args = [arg for arg in typing.get_args(annotation) if arg is not Ellipsis]
        return bool(args) and all(is_plain_type(arg) for arg in args)
    return False


def admits(annotation: Any, value: Any, strings: Strings = "names", depth: int = 0) -> bool:
    """Whether ``value`` is plain data of ``annotation``: checked by ``isinstance``, never converted or parsed.

    A number, a boolean or ``None`` needs one member of the union that admits it (``lr: float | Tensor``
    takes a float). A string, a list or a dict needs the whole annotation to be plain, so that no other
    member could read it as something else. ``strings``: a free string must look like a name.
    """
    if depth > 8:
        return False
    members = _members(annotation)
    if value is None:
        return any(_is_none(member) for member in members) or any(
            typing.get_origin(member) is Literal and None in typing.get_args(member) for member in members
        )
    if isinstance(value, bool | int | float):
        return any(_admits_number(member, value) for member in members)
    if not is_plain_type(annotation):
        return False
    return any(_admits_plain(member, value, strings, depth) for member in members)


def _admits_number(member: Any, value: bool | int | float) -> bool:
    if typing.get_origin(member) is Literal:
        return any(type(item) is type(value) and item == value for item in typing.get_args(member))
    if isinstance(value, bool):
        return member is bool
    if isinstance(value, float) and not math.isfinite(value):
        return member is float
    return member is float or (member is int and isinstance(value, int))


def _admits_plain(member: Any, value: Any, strings: Strings, depth: int) -> bool:
    origin = typing.get_origin(member)
    if origin is Literal:
        return any(type(item) is type(value) and item == value for item in typing.get_args(member))
    if member is str:
        if not isinstance(value, str) or strings == "literals":
            return False
        return strings == "any" or NAME.fullmatch(value) is not None
    if origin in (list, collections.abc.Sequence) or (origin is tuple and Ellipsis in typing.get_args(member)):
        (item,) = [arg for arg in typing.get_args(member) if arg is not Ellipsis]
        return (
            isinstance(value, list | tuple)
            and len(value) <= MAX_ITEMS
            and all(admits(item, element, strings, depth + 1) for element in value)
        )
    if origin is tuple:
        items = typing.get_args(member)
        return (
            isinstance(value, list | tuple)
            and len(value) == len(items)
            and all(admits(item, element, strings, depth + 1) for item, element in zip(items, value, strict=True))
        )
    if origin in (dict, collections.abc.Mapping):
        key_type, value_type = typing.get_args(member)
        return (
            isinstance(value, dict)
            and len(value) <= MAX_ITEMS
            and all(admits(key_type, key, "names", depth + 1) for key in value)
            and all(admits(value_type, item, strings, depth + 1) for item in value.values())
        )
    return False


def number_or_nan(value: Any) -> float:
    """A file's number as a float; anything else (a boolean, a string, an object) as NaN, never converted."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
