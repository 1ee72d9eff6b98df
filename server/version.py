"""psrv's version: the installed distribution's (importlib.metadata), one definition for the CLI and code.

``psrv`` is a namespace over folders and has no ``__init__`` of its own, so the version lives here and
is also set as ``psrv.__version__`` when psrv.server or psrv.spark is imported.
"""

from __future__ import annotations

import sys
from importlib import metadata


def version() -> str:
    try:
        return metadata.version("psrv")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"


__version__ = version()


def publish() -> None:
    """Set ``psrv.__version__`` on the namespace package (once something of psrv is imported)."""
    namespace = sys.modules.get("psrv")
    if namespace is not None and not hasattr(namespace, "__version__"):
        namespace.__version__ = __version__


__all__ = ["__version__", "publish", "version"]
