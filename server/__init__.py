"""psrv.server: the parameter server in each process and the `psrv` command line."""

from psrv.server.version import __version__, publish

publish()

__all__ = ["__version__"]
