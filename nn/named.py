"""Building a configured object by its name (an activation, a layer, an updater, a schedule) from a
table of the types psrv knows, with one clear ConfigError for an unknown name or bad options."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from psrv.nn.errors import ConfigError

__all__ = ["build_named"]

T = TypeVar("T")


def build_named(table: Mapping[str, Callable[..., T]], name: Any, options: Mapping[str, Any], what: str) -> T:
    """``table[name](**options)``; a ConfigError naming ``what`` when ``name`` is not in the table or the
    options do not fit its type."""
    factory = table.get(name)
    if factory is None:
        raise ConfigError(f"unknown {what} {name!r}; expected one of {sorted(set(table))}")
    try:
        return factory(**options)
    except TypeError as exc:
        raise ConfigError(f"bad options for {what} {name!r}: {exc}") from exc
