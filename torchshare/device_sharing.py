"""A device worker's side of gradient sharing (a network whose live parameters are torch tensors).

The residual and the threshold encoding stay on the device (psrv.encoding.device); only the encoded
message crosses to the host, through a reused staging buffer (pinned when the device is CUDA); received
updates are decoded into the device parameters by the node's apply hooks, under the node's lock (the
updates of one UPDATES frame together: one host-to-device copy and one kernel for all of them); a download
(catch-up, re-sync) lands in a host vector and is installed on the device. It runs on CPU tensors too
(tests use it so in CI). Used by a Spark task's TorchNetwork and by psrv.torch's DistributedOptimizer.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from psrv.encoding.messages import compact
from psrv.nn.protocol import DeviceNetwork
from psrv.server.update_intake import decode_or_reject


class DeviceSharing:
    """Gradient sharing for a network whose live parameters are torch tensors (see the module docstring).

    ``node_params`` and ``node_hooks()`` go to the Node; each step call ``step(node, batch, ...)``.
    """

    def __init__(self, network: DeviceNetwork, encoder: Any) -> None:
        self.network = network
        self.encoder = encoder
        self.node_params = network.params.copy()  # one host copy: the node's download target
        self._staging: Any = None

    def node_hooks(self) -> dict[str, Any]:
        return {"apply": self.apply, "apply_many": self.apply_many, "installed": self.installed}

    def apply(self, payload: np.ndarray, header: dict) -> None:
        """The node's apply hook (called under its lock): decode a received update on the device."""
        from psrv.encoding import device as codec  # lazy: the device codec needs torch

        decode_or_reject(codec.decode, payload, self.network.flat_params, header)

    def apply_many(self, payloads: list[np.ndarray], headers: list[dict]) -> list[Exception | None]:
        """The node's batch hook (under its lock): an UPDATES frame's updates with one transfer and one
        kernel on the device; a malformed one is returned as its error, the others are applied."""
        from psrv.encoding import device as codec  # lazy: the device codec needs torch

        return codec.decode_many(payloads, self.network.flat_params)

    def installed(self, params: np.ndarray) -> None:
        """The node downloaded the master copy into ``params`` (under its lock): put it on the device."""
        self.network.set_params(params)

    def to_host(self, message: Any) -> np.ndarray:
        """The message as a NEW host int32 array (the node keeps it), through the reused staging buffer."""
        import torch

        size = int(message.numel())
        if self._staging is None or self._staging.numel() < size:
            capacity = max(size, 2 * (self._staging.numel() if self._staging is not None else 0), 1024)
            pin = message.device.type == "cuda"
            self._staging = torch.empty(capacity, dtype=torch.int32, pin_memory=pin)
        view = self._staging[:size]
        view.copy_(message)  # synchronous: the host copy below reads it at once
        return view.numpy().copy()

    def submit(self, node: Any, message: Any, iteration: int, epoch: int) -> int:
        """Apply an encoded update (a device tensor) locally and hand its host copy to the node, both
        under the node's lock (a re-sync never sees half of it). Returns the bytes sent."""
        from psrv.encoding import device as codec  # lazy: imports torch, which a CPU task never needs

        host = self.to_host(message)
        wire = compact(host)  # the form it travels in, so the bytes counted are the wire's
        with node.lock:  # validated on the host copy; the device copy is applied (no device sync)
            codec.decode(host, self.network.flat_params, device_copy=message)
            node.submit(wire, iteration=int(iteration), epoch=int(epoch))
        return int(wire.nbytes)

    def set_residual(self, residual: np.ndarray) -> None:
        """Start from a residual carried over on the host (a previous task of the same master)."""
        import torch

        self.encoder.residual.copy_(torch.from_numpy(np.asarray(residual)))


__all__ = ["DeviceSharing"]
