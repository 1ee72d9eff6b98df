"""The installed distribution's version: the one definition of ``psrv.__version__``.

A module of its own, so that the subpackages can read the version without importing the top-level
package's ``__init__`` (whose ``psrv.run`` reaches ``psrv.torch`` when called).
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
