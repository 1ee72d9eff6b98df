"""What a launcher tells the processes it starts, through their environment.

A launcher (``psrv.run``, ``psrv run -n N``, ``psrv.spark.run``) sets these variables in every worker
process; ``init()`` reads them. The rendezvous address and its key let a worker reach the launcher, which
starts the controller once rank 0 has sent its initial parameters and hands every rank its address.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from psrv.torch.errors import LauncherRequiredError

RENDEZVOUS_ENV = "PSRV_RENDEZVOUS"  # host:port of the launcher's rendezvous
RENDEZVOUS_KEY_ENV = "PSRV_RENDEZVOUS_KEY"  # hex key authenticating the rendezvous connection
RANK_ENV = "PSRV_RANK"
SIZE_ENV = "PSRV_WORLD_SIZE"
LOCAL_RANK_ENV = "PSRV_LOCAL_RANK"
DEVICE_ENV = "PSRV_DEVICE"  # the device this worker trains on ("cpu", "cuda:1"); unset = the model's
JOB_ENV = "PSRV_JOB"  # the job's name (node names, logs)


@dataclass(frozen=True)
class WorkerEnvironment:
    """One worker's place in a job, as its launcher described it."""

    rendezvous: str
    key: bytes
    rank: int
    size: int
    local_rank: int
    job: str = "psrv"
    device: str | None = None

    def variables(self) -> dict[str, str]:
        """The environment variables that describe this worker (what a launcher sets)."""
        out = {RENDEZVOUS_ENV: self.rendezvous, RENDEZVOUS_KEY_ENV: self.key.hex(), RANK_ENV: str(self.rank),
               SIZE_ENV: str(self.size), LOCAL_RANK_ENV: str(self.local_rank), JOB_ENV: self.job}
        if self.device:
            out[DEVICE_ENV] = self.device
        return out

    @classmethod
    def from_variables(cls, env: Mapping[str, str] | None = None) -> WorkerEnvironment:
        """The worker's place read from ``env`` (default ``os.environ``); a clear error outside a launcher."""
        env = os.environ if env is None else env
        if not env.get(RENDEZVOUS_ENV):
            raise LauncherRequiredError(
                "psrv.torch.init(): this process was not started by a psrv launcher (no "
                f"{RENDEZVOUS_ENV} in its environment); run the training function with "
                "psrv.run(train_fn, num_workers=N), the script with `psrv run -n N script.py`, or "
                "on Spark with psrv.spark.run(train_fn, num_workers=N)")
        try:
            return cls(rendezvous=env[RENDEZVOUS_ENV], key=bytes.fromhex(env[RENDEZVOUS_KEY_ENV]),
                       rank=int(env[RANK_ENV]), size=int(env[SIZE_ENV]),
                       local_rank=int(env.get(LOCAL_RANK_ENV, env[RANK_ENV])),
                       job=env.get(JOB_ENV, "psrv"), device=env.get(DEVICE_ENV) or None)
        except (KeyError, ValueError) as exc:
            raise LauncherRequiredError(
                f"psrv.torch.init(): the launcher's environment is incomplete or malformed ({exc!r}); "
                f"expected {RENDEZVOUS_KEY_ENV}, {RANK_ENV} and {SIZE_ENV} beside {RENDEZVOUS_ENV}") from exc


__all__ = [
    "DEVICE_ENV",
    "JOB_ENV",
    "LOCAL_RANK_ENV",
    "RANK_ENV",
    "RENDEZVOUS_ENV",
    "RENDEZVOUS_KEY_ENV",
    "SIZE_ENV",
    "WorkerEnvironment",
]
