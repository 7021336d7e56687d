"""Keyword arguments renamed in a release, still accepted under their old name for one more.

A rename must not break a caller on upgrade: the old keyword keeps working, with a
DeprecationWarning naming the new one, until the release after (CHANGELOG, "Renamed"). Giving
both names is a TypeError, as a repeated keyword would be.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])


def renamed_kwargs(**renames: str) -> Callable[[F], F]:
    """Accept each `old=new` keyword under its old name too; on a class, for its `__init__`
    (put it above `@dataclass`)."""

    def decorate(target: F) -> F:
        if isinstance(target, type):
            init = vars(target)["__init__"]
            # setattr: mypy refuses assigning to a method
            setattr(target, "__init__", functools.wraps(init)(_accepting(init, renames)))  # noqa: B010
            return target
        return cast(F, functools.wraps(target)(_accepting(target, renames)))

    return decorate


def _accepting(function: Callable[..., Any], renames: dict[str, str]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(function):

        async def call_async(*args: Any, **kwargs: Any) -> Any:
            return await function(*args, **_renamed(kwargs, renames))

        return call_async

    def call(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **_renamed(kwargs, renames))

    return call


def _renamed(kwargs: dict[str, Any], renames: dict[str, str]) -> dict[str, Any]:
    for old, new in renames.items():
        if old not in kwargs:
            continue
        if new in kwargs:
            raise TypeError(f"{old} is the old name of {new}: give only {new}")
        warnings.warn(
            f"{old} is renamed {new}; the old name goes in the next release",
            DeprecationWarning,
            stacklevel=3,
        )
        kwargs[new] = kwargs.pop(old)
    return kwargs
