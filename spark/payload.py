"""What travels from the driver to the executors to rebuild a network: config + flat vectors.

The network is never pickled whole: its JSON-able configuration, its flat parameter vector,
optionally its flat updater state and its normalizer state are enough to rebuild an identical
network on an executor (``Network.from_config`` + copying the vectors in). Executors keep the
last networks they built, keyed by the payload's id, so the tasks of one job reuse them.
"""

from __future__ import annotations

import inspect
import threading
import uuid
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_CACHE_SIZE = 4
_cache: OrderedDict[str, Any] = OrderedDict()
_cache_lock = threading.Lock()
_lineages: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_lineage_lock = threading.Lock()


def lineage(network: Any) -> str:
    """The token naming this driver-side network object (the same for all its fits)."""
    with _lineage_lock:
        try:
            token = _lineages.get(network)
            if token is None:
                token = _lineages[network] = uuid.uuid4().hex
        except TypeError:  # not weak-referenceable: a fresh token per payload (always rebuilt)
            token = uuid.uuid4().hex
    return token


def _file_form(network: Any) -> bytes:
    """The network's file form with ``__main__``/notebook code pickled by value (cloudpickle)."""
    try:
        accepts = "pickle_module" in inspect.signature(network.to_bytes).parameters
    except (TypeError, ValueError):
        accepts = False
    if not accepts:
        return network.to_bytes()
    from pyspark import cloudpickle

    return network.to_bytes(pickle_module=cloudpickle)


@dataclass
class NetworkPayload:
    config: dict
    params: np.ndarray
    updater_state: np.ndarray | None = None
    normalizer_state: dict | None = None
    iteration: int = 0
    epoch: int = 0
    key: str = field(default_factory=lambda: uuid.uuid4().hex)
    # networks that are code rather than data (psrv.nn.TorchNetwork) travel in their own file form
    blob: bytes | None = None
    factory: Any = None
    lineage: str = ""

    @classmethod
    def from_network(cls, network: Any, *, with_updater: bool = False) -> NetworkPayload:
        from psrv.nn.network import Network

        normalizer = getattr(network, "normalizer", None)
        blob, factory = None, None
        if not isinstance(network, Network):
            if not (hasattr(network, "to_bytes") and hasattr(type(network), "from_bytes")):
                from psrv.spark.errors import SparkConfigError

                raise SparkConfigError(
                    f"cannot ship a {type(network).__name__} to the executors: expected a psrv.nn.Network "
                    "or a network with to_bytes() and from_bytes() (e.g. psrv.nn.TorchNetwork)"
                )
            blob, factory = _file_form(network), type(network)
        return cls(
            config=network.get_config(),
            params=np.array(network.params, dtype=np.float32, copy=True),
            updater_state=np.array(network.updater_state, copy=True) if with_updater else None,
            normalizer_state=normalizer.get_state() if normalizer is not None else None,
            iteration=int(getattr(network, "iteration", 0)),
            epoch=int(getattr(network, "epoch", 0)),
            blob=blob,
            factory=factory,
            lineage=lineage(network),
        )

    def build(self) -> Any:
        """A new network equal to the one this payload was made from."""
        if self.blob is not None:
            network = self.factory.from_bytes(self.blob)
        else:
            from psrv.nn import Network

            network = Network.from_config(self.config)
        self.load_into(network)
        if self.normalizer_state is not None:
            from psrv.nn.normalizers import normalizer_from_state

            network.normalizer = normalizer_from_state(self.normalizer_state)
        return network

    def load_into(self, network: Any) -> None:
        """Copy parameters (and updater state, counters) into an already built network."""
        if network.params.shape != self.params.shape:
            from psrv.spark.errors import SparkConfigError

            raise SparkConfigError(
                f"parameter vector of {self.params.size} floats does not fit a network of "
                f"{network.params.size} parameters"
            )
        network.params[...] = self.params
        if self.updater_state is not None:
            network.set_updater_state(self.updater_state)
        set_counters(network, self.iteration, self.epoch)

    def cached_network(self) -> Any:
        """The network for this payload, built once per executor process (read-only use)."""
        with _cache_lock:
            network = _cache.get(self.key)
            if network is not None:
                _cache.move_to_end(self.key)
                return network
        network = self.build()
        with _cache_lock:
            _cache[self.key] = network
            while len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
        return network


def set_counters(network: Any, iteration: int, epoch: int) -> None:
    """Set a network's iteration/epoch counters (used by learning-rate schedules), where settable."""
    for name, value in (("iteration", iteration), ("epoch", epoch)):
        try:
            setattr(network, name, int(value))
        except AttributeError:
            setter = getattr(network, f"set_{name}", None)
            if setter is not None:
                setter(int(value))
