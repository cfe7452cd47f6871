"""The checks every kw-only config dataclass gets on construction: names first, then each value against its type.

A misspelled, missing or positional option, or a value of the wrong type, is a :class:`~ckptio.errors.ConfigError`
naming the option (and, for a misspelling, the closest valid name), never Python's bare ``TypeError``: the CLI turns
a ConfigError into its usage error, and a type checked here is one the range checks of ``__post_init__`` may rely on.
This module knows no option by name: what a field may hold is read from the dataclass's own annotations.
"""

from __future__ import annotations

import difflib
import functools
import numbers
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from ckptio.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_Config = TypeVar("_Config", bound="DataclassInstance")


def unknown_option_error(name: str, valid: list[str]) -> ConfigError:
    """``name`` is not a valid option: name the closest valid one (difflib), or list them all."""
    close = difflib.get_close_matches(name, valid, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"valid options: {', '.join(sorted(valid))}"
    return ConfigError(f"unknown option {name!r}; {hint}")


def keyword_options_only(cls: type[_Config]) -> type[_Config]:
    """Check the names given to the dataclass's generated ``__init__`` first, so that a misspelled, missing or
    positional option is a ConfigError (the CLI's usage error) rather than Python's TypeError."""
    generated: Callable[..., None] = cls.__init__
    valid = [f.name for f in fields(cls)]
    required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]

    @functools.wraps(generated)
    def __init__(self: Any, *args: Any, **options: Any) -> None:
        if args:
            raise ConfigError(f"{cls.__name__} takes keyword options only, got {len(args)} positional")
        for name in options:
            if name not in valid:
                raise unknown_option_error(name, valid)
        for name in required:
            if name not in options:
                raise ConfigError(f"{cls.__name__} needs {name}")
        generated(self, **options)

    cls.__init__ = __init__  # type: ignore[method-assign]  # the checked wrapper replaces the generated one
    return cls


# What a value must be an instance of, per annotated type, where that is wider than the type itself.
_ACCEPTED: dict[Any, tuple[type, ...]] = {
    int: (numbers.Integral,),  # numpy integers too
    float: (numbers.Real,),  # an int is a fine number of seconds
    tuple: (tuple, list),  # data_dirs=[...] is normalised to a tuple in __post_init__
    type(None): (type(None),),
}


def _matches(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if origin is Literal:
        return value in typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, member) for member in typing.get_args(hint))
    leaf = origin or hint  # dict[str, Any] -> dict, os.PathLike[str] -> os.PathLike
    if isinstance(value, bool) and leaf is not bool:
        return False  # bool is an int to Python, never a count or a size to us
    return isinstance(value, _ACCEPTED.get(leaf, (leaf,)))


@functools.cache
def _field_types(cls: type) -> dict[str, tuple[Any, str]]:
    """Each field's resolved type and its annotation as written (for messages). Resolved on first use, so that
    importing this module does not import the storage and policy packages that Storage and Residency live in."""
    from ckptio.policy.residency import Residency
    from ckptio.storage.base import Storage

    hints = typing.get_type_hints(cls, localns={"Storage": Storage, "Residency": Residency})
    return {f.name: (hints[f.name], str(f.type)) for f in fields(cls)}


def check_option_types(config: DataclassInstance) -> None:
    """Raise ConfigError naming the first field of ``config`` (a dataclass) whose value does not match its
    annotation: option, expected type and value."""
    for name, (hint, written) in _field_types(type(config)).items():
        value = getattr(config, name)
        if not _matches(value, hint):
            expected = written
            if typing.get_origin(hint) is Literal:
                expected = "one of " + ", ".join(repr(choice) for choice in typing.get_args(hint))
            raise ConfigError(f"{name} must be {expected}, got {value!r} ({type(value).__name__})")
