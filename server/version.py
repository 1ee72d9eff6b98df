"""psrv's version for the CLI and code: the one definition is ``psrv._version`` (``psrv.__version__``)
(the installed distribution's, from importlib.metadata)."""

from __future__ import annotations

from psrv._version import __version__


def version() -> str:
    return __version__


__all__ = ["__version__", "version"]
