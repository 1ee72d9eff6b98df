"""A worker process that runs the Spark task's own code (``SharingTrainer``) without Spark.

Usage: ``python replica_worker.py IN.pkl OUT.pkl``. IN holds the WorkerSetup, the minibatches, a mode
and, optionally, ``device_sharing`` (share through the device path even on CPU tensors); OUT gets the
task's WorkerResult and the float64 sum of every update the task submitted (what the master copy must
hold from it: nothing lost, nothing twice). Mode "legacy" re-creates an old bug (a compute_update that
snapshots params and writes them back) to show the check catches it.
"""

from __future__ import annotations

import pickle
import sys
import time

import numpy as np


class _Broadcast:  # what the task reads of a Spark Broadcast
    def __init__(self, value) -> None:
        self.value = value


def _legacy_compute_update(original):
    def compute_update(self, features, labels, mask=None):
        snapshot = self.params.copy()
        result = original(self, features, labels, mask)
        time.sleep(0.003)  # the window in which the node's I/O thread decodes into params
        self.params[...] = snapshot  # the old TorchNetwork's copy-back: erases what arrived meanwhile
        return result

    return compute_update


def main(source: str, target: str) -> None:
    from psrv.encoding import decode
    from psrv.server.node import Node
    from psrv.spark.task.sharing import SharingTrainer

    with open(source, "rb") as fh:
        job = pickle.load(fh)
    setup, batches, mode = job["setup"], job["batches"], job["mode"]
    sent = np.zeros(setup.payload.params.size, dtype=np.float64)
    submit = Node.submit

    def recording_submit(self, message, **kwargs):
        decode(message, sent)
        return submit(self, message, **kwargs)

    Node.submit = recording_submit
    if mode == "legacy":
        network_class = setup.payload.factory
        if network_class is None:
            from psrv.nn import Network as network_class
        network_class.compute_update = _legacy_compute_update(network_class.compute_update)
    trainer_class = SharingTrainer
    if job.get("device_sharing"):  # the device path (DeviceSharing) on whatever device the network is on

        class trainer_class(SharingTrainer):  # noqa: N801 - a local stand-in for the class
            def device_sharing(self, network) -> bool:
                return True

    results = list(trainer_class(_Broadcast(setup), None)(iter(batches)))
    with open(target, "wb") as fh:
        pickle.dump({"results": results, "sent": sent}, fh)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
