"""psrv.server: the parameter server in each process and the `psrv` command line."""

from psrv.server.version import __version__

__all__ = ["__version__"]
