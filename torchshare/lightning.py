"""``PsrvStrategy``: a Lightning ``Trainer`` that shares its steps through psrv, inside ``psrv.run`` or
``psrv.spark.run``.

Each launched worker builds its own ``Trainer(strategy=PsrvStrategy())`` and calls ``fit``. The strategy
takes the worker's place from the launcher (rank, size, device), wraps the one optimizer that
``configure_optimizers`` returns in a :class:`~psrv.torch.DistributedOptimizer` (which joins the job and
downloads the master copy, so every rank starts from rank 0's parameters), gives each rank its shard of
the training data (Lightning's ``DistributedSampler``, as under DDP) and, when ``fit`` ends, leaves: it
waits until the controller holds every update sent, checks the replica against the master copy and stops
the node (what ``psrv.run`` returns holds the master copy). Schedulers, gradient
clipping (``gradient_clip_val``), ``accumulate_grad_batches`` and the precision plugins work as on one
device: Lightning calls the wrapped optimizer's ``step`` like any optimizer's.

There is no collective communication: ``reduce``, ``all_gather`` and ``broadcast`` return this worker's
own value and ``barrier`` returns at once, so ``self.log(..., sync_dist=True)`` logs the worker's own
value (rank 0 writes logs and checkpoints). One ``fit`` per launched function: the worker leaves the job
when it ends.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from lightning_utilities.core.rank_zero import rank_zero_only as utilities_rank_zero_only
from psrv.torch import session
from psrv.torch.errors import SharingConfigError
from psrv.torch.optimizer import DistributedOptimizer


class PsrvStrategy(ParallelStrategy):
    """Lightning's strategy for psrv's gradient sharing (build it inside the launched function).

    ``threshold_algorithm``, ``post_processor``, ``device_encoding``, ``step_from``: as for
    ``DistributedOptimizer``.
    ``accelerator``, ``checkpoint_io``, ``precision_plugin``: Lightning's (the Trainer's flags fill them).
    The device is the one the launcher gave this worker (``psrv.torch.device()``); outside a launcher the
    constructor raises ``LauncherRequiredError``.
    """

    strategy_name = "psrv"

    def __init__(self, *, threshold_algorithm: Any = None, post_processor: Any = None,
                 device_encoding: bool | None = None, step_from: str = "own", accelerator: Any = None,
                 checkpoint_io: Any = None, precision_plugin: Any = None) -> None:
        self._place = session.init()
        device = torch.device(self._place.device or "cpu")
        super().__init__(accelerator=accelerator, parallel_devices=[device], checkpoint_io=checkpoint_io,
                         precision_plugin=precision_plugin)
        self._device = device
        self._sharing = {"threshold_algorithm": threshold_algorithm, "post_processor": post_processor,
                         "device_encoding": device_encoding, "step_from": step_from}
        self.distributed_optimizer: DistributedOptimizer | None = None
        #: this worker's report once ``fit`` ended (steps, messages, bytes, the replica check)
        self.report: dict[str, Any] | None = None

    # --- the worker's place ---------------------------------------------------------------------------

    @property
    def root_device(self) -> torch.device:
        return self._device

    @property
    def global_rank(self) -> int:
        return self._place.rank

    @property
    def local_rank(self) -> int:
        return self._place.local_rank

    @property
    def node_rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return self._place.size

    @property
    def is_distributed(self) -> bool:
        """Read by the Trainer: each rank trains on its shard (a DistributedSampler, as under DDP)."""
        return True

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    def set_world_ranks(self) -> None:
        """The launcher set the ranks (not the Trainer's cluster environment); Lightning's rank-zero-only
        logging and hooks learn this worker's."""
        rank_zero_only.rank = utilities_rank_zero_only.rank = self.global_rank

    def model_to_device(self) -> None:
        assert self.model is not None, "the Trainer connects the model before moving it"
        self.model.to(self.root_device)

    # --- the optimizer ---------------------------------------------------------------------------------

    def setup_optimizers(self, trainer: Any) -> None:
        """Lightning's optimizers and schedulers, the optimizer wrapped (it joins the job here)."""
        super().setup_optimizers(trainer)
        if len(self.optimizers) != 1:
            raise SharingConfigError(
                f"PsrvStrategy: configure_optimizers returned {len(self.optimizers)} optimizers; psrv shares "
                "one model per worker: return one optimizer (with several param groups if needed)")
        module = self.lightning_module
        assert module is not None
        self.distributed_optimizer = DistributedOptimizer(self.optimizers[0], module, **self._sharing)
        self.optimizers = [self.distributed_optimizer]

    # --- no collectives: every worker's own value ------------------------------------------------------

    def reduce(self, tensor: Any, *args: Any, **kwargs: Any) -> Any:
        return tensor

    def all_gather(self, tensor: Any, group: Any = None, sync_grads: bool = False) -> Any:
        return tensor

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to wait for: the workers share updates, never a step."""

    # --- leaving ----------------------------------------------------------------------------------------

    def on_train_end(self) -> None:
        """Leave the job: drain, check the replica against the master copy, stop the node."""
        super().on_train_end()
        if self.distributed_optimizer is not None and self.report is None:
            self.report = session.shutdown()


__all__ = ["PsrvStrategy"]
