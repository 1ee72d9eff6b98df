"""The contracts a network keeps for the trainers (the Spark masters, the tasks, the estimators).

``TrainableNetwork`` is what every network trained by psrv offers; the smaller Protocols name optional
capabilities that a trainer checks with ``isinstance`` (all are ``runtime_checkable``) instead of
probing attributes. The gradient-sharing rule they rest on: ``compute_update`` returns the step to add
and never writes ``params``; only ``apply_update``/``set_params`` (and the node's decode) write them.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class TrainableNetwork(Protocol):
    """A network psrv trains: flat parameters and updater state, one step at a time, its file form."""

    seed: int
    input_shape: Any
    num_outputs: int
    normalizer: Any  # a psrv.nn normalizer or None

    @property
    def iteration(self) -> int: ...

    @iteration.setter
    def iteration(self, value: int) -> None: ...

    @property
    def epoch(self) -> int: ...

    @epoch.setter
    def epoch(self, value: int) -> None: ...

    @property
    def params(self) -> np.ndarray:
        """The flat parameter vector (a host view or copy; write it through ``set_params``)."""
        ...

    @property
    def num_params(self) -> int: ...

    @property
    def updater_state(self) -> np.ndarray: ...

    def set_params(self, params: np.ndarray) -> None: ...

    def set_updater_state(self, state: np.ndarray) -> None: ...

    def compute_update(self, features: Any, labels: Any, mask: Any = None) -> tuple[np.ndarray, float]:
        """The step to add for one minibatch, and its loss; never writes ``params``."""
        ...

    def apply_update(self, update: Any) -> None: ...

    def output(self, features: Any) -> Any: ...

    def evaluate(self, data: Any, evaluation: Any = None, batch_size: int = 4096) -> Any: ...

    def get_config(self) -> dict[str, Any]: ...

    def to_bytes(self) -> bytes: ...

    @classmethod
    def from_bytes(cls, data: bytes) -> TrainableNetwork:
        """The network ``to_bytes`` wrote."""
        ...


@runtime_checkable
class DeviceNetwork(TrainableNetwork, Protocol):
    """A network whose live parameters are torch tensors on a device: steps and updates stay there."""

    device: Any  # torch.device

    @property
    def on_host(self) -> bool:
        """True when the device is the CPU."""
        ...

    @property
    def flat_params(self) -> Any:
        """The live flat parameter tensor (on ``device``)."""
        ...

    def compute_update_tensor(self, features: Any, labels: Any, mask: Any = None) -> tuple[Any, float]:
        """``compute_update`` with the step left on the device."""
        ...


@runtime_checkable
class BufferedNetwork(Protocol):
    """A network with state that is not a parameter (BatchNorm statistics): it travels and is averaged."""

    def get_buffers(self) -> dict[str, np.ndarray]: ...

    def set_buffers(self, buffers: Any) -> None: ...


@runtime_checkable
class MultiIONetwork(Protocol):
    """A network that may take several inputs or give several outputs (one array per input/output)."""

    @property
    def multi_input(self) -> bool: ...

    @property
    def multi_output(self) -> bool: ...

    @property
    def output_sizes(self) -> tuple[int, ...]: ...


def is_multi_io(network: TrainableNetwork) -> bool:
    """Whether ``network`` takes several inputs or gives several outputs."""
    return isinstance(network, MultiIONetwork) and (network.multi_input or network.multi_output)


def network_device(network: TrainableNetwork) -> str:
    """Where the network's live parameters are ("cpu" for a host network)."""
    return str(network.device) if isinstance(network, DeviceNetwork) else "cpu"


__all__ = [
    "BufferedNetwork", "DeviceNetwork", "MultiIONetwork", "TrainableNetwork", "is_multi_io", "network_device",
]
