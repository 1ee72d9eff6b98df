"""psrv: gradient-sharing training of neural networks on Apache Spark over a ZeroMQ mesh.

The top-level package holds only the version, so that ``import psrv`` stays light (no numba, Spark or
torch); the work lives in ``psrv.encoding``, ``psrv.transport``, ``psrv.server``, ``psrv.nn`` and
``psrv.spark`` (each its own folder of the source tree, mapped here by ``pyproject.toml``).
"""

from __future__ import annotations

from importlib import metadata


def _installed_version() -> str:
    """The installed distribution's version; a source tree that was never installed says so."""
    try:
        return metadata.version("psrv")
    except metadata.PackageNotFoundError:
        return "0+unknown"


__version__ = _installed_version()

__all__ = ["__version__"]
