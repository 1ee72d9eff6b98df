"""Errors raised by psrv.transport; every one derives from one base class."""

from __future__ import annotations


class TransportError(Exception):
    """Base class of every error raised by psrv.transport."""


# --- policy errors (transport-policy engineer: mesh, membership, dedup, netmask, keys) ---
# All of these are fatal for the call that raised them: they signal a bug or a bad
# configuration, and retrying the same call cannot succeed.


class MeshError(TransportError):
    """The mesh organizer was asked something impossible, or a mesh is not a whole tree. Fatal."""


class UnknownNodeError(MeshError):
    """A node id that is not (or no longer) part of the mesh. Fatal for that request."""


class InvalidSequenceError(TransportError, ValueError):
    """An update's origin id or sequence number is not a valid positive integer. Fatal for that update."""


class AddressSelectionError(TransportError):
    """The address to bind and advertise could not be chosen. Fatal (configuration)."""


class InvalidNetworkMaskError(AddressSelectionError, ValueError):
    """The configured network mask (or the address override) is not a valid CIDR / IP address."""


class NoMatchingInterfaceError(AddressSelectionError):
    """No local interface has an address inside the configured network mask."""


class KeyFileError(TransportError):
    """A CurveZMQ key directory is missing, incomplete, corrupt or would be overwritten. Fatal."""
