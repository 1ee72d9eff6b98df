"""Errors raised by psrv.transport; every one derives from one base class."""

from __future__ import annotations

__all__ = [
    "AddressSelectionError", "ControllerLostError", "FatalTransportError", "FrameRejectedError",
    "InvalidNetworkMaskError", "InvalidSequenceError", "InvalidUpdateError", "JoinError", "KeyFileError",
    "MeshError", "NoMatchingInterfaceError", "NotRunningError", "RetryableTransportError",
    "SecurityMismatchError", "SendQueueFullError", "TransportConfigError", "TransportError",
    "UnknownNodeError",
]


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


# --- runtime errors (transport-runtime engineer): fatal vs. retryable is visible in the type ---


class FatalTransportError(TransportError):
    """Retrying the same call will not help: the configuration or the peer is wrong or gone."""


class RetryableTransportError(TransportError):
    """A transient condition: the same call may succeed a little later."""


class TransportConfigError(FatalTransportError, ValueError):
    """A TransportConfig (or a command-line option feeding it) holds an invalid value."""


class JoinError(FatalTransportError):
    """A node could not join its controller before the join deadline."""


class SecurityMismatchError(JoinError):
    """The peer refused the handshake: it runs with other security settings (keys vs --insecure, or
    another key set). Fatal: the message names the option that makes both sides agree."""


class ControllerLostError(FatalTransportError):
    """A node stopped hearing its controller (or was told it shut down) and stopped itself."""


class NotRunningError(FatalTransportError):
    """The role was used before start() or after stop()."""


class SendQueueFullError(RetryableTransportError):
    """The bounded submit queue stayed full for the whole submit timeout; submit again later."""


class FrameRejectedError(TransportError):
    """A received frame was malformed, unknown, oversized or inconsistent; ``reason`` names the counter."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class InvalidUpdateError(FatalTransportError, ValueError):
    """submit() was given something that is not an encoded update for this model."""
