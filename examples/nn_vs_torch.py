"""The same model as a ``psrv.nn.Network`` and as a ``TorchNetwork``, trained the same way on Spark.

An MLP (8 -> 32 relu -> 3 softmax, Adam) written twice: with psrv's own NumPy layers and as a PyTorch
module. The torch copy starts from the psrv network's initial weights (psrv's ``W`` is ``(in, out)``,
torch's ``Linear.weight`` its transpose), so before training both give the same outputs. Both are then
trained by gradient sharing on the same DataSets for the same epochs and evaluated on the same test set.
Use ``psrv.nn`` for small dense models (no torch needed, fast on CPU); use ``TorchNetwork`` for anything
else (convolution-heavy models, sequences, several inputs or outputs).

    spark-submit --master local-cluster[2,1,1024] examples/nn_vs_torch.py
    python examples/nn_vs_torch.py                    # local[2]

Needs torch (``pip install psrv[torch]``).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import parser, report, sharing_master, spark_session  # noqa: E402

FEATURES, CLASSES = 8, 3


def blobs(rows: int, batch_size: int, seed: int) -> list:
    """DataSets of three overlapping Gaussian classes in 8 dimensions (centres fixed, draws seeded)."""
    from psrv.nn import DataSet

    centres = np.random.default_rng(1234).normal(0.0, 1.0, (CLASSES, FEATURES))
    rng = np.random.default_rng(seed)
    labels = rng.integers(CLASSES, size=rows)
    x = (centres[labels] + rng.normal(0.0, 1.2, (rows, FEATURES))).astype(np.float32)
    y = np.eye(CLASSES, dtype=np.float32)[labels]
    return [DataSet(x[i:i + batch_size], y[i:i + batch_size]) for i in range(0, rows, batch_size)]


def psrv_mlp(seed: int):
    from psrv.nn import Adam, Dense, Network, Output

    return Network([Dense(32, activation="relu"), Output(CLASSES, activation="softmax")],
                   input_shape=(FEATURES,), updater=Adam(1e-2), seed=seed)


def _adam(parameters):
    return torch.optim.Adam(parameters, lr=1e-2)


def torch_mlp_like(network):
    """The same MLP as a torch module wrapped in a TorchNetwork, starting from ``network``'s weights."""
    from psrv.nn import TorchNetwork

    module = torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, CLASSES))
    with torch.no_grad():
        for linear, layer in zip((module[0], module[2]), network.layers, strict=True):
            linear.weight.copy_(torch.from_numpy(layer.params["W"].T.copy()))
            linear.bias.copy_(torch.from_numpy(layer.params["b"].copy()))
    return TorchNetwork(module, torch.nn.CrossEntropyLoss(), input_shape=(FEATURES,), optimizer=_adam,
                        output_activation="softmax")


def run(spark, args) -> dict:
    from psrv.spark import SparkNetwork

    sc = spark.sparkContext
    train = sc.parallelize(blobs(args.train, 32, args.seed), 2)
    test = blobs(args.test, 100, args.seed + 1)
    ours = psrv_mlp(args.seed)
    theirs = torch_mlp_like(ours)
    probe = test[0].features
    start_difference = float(np.abs(ours.output(probe) - np.asarray(theirs.output(probe))).max())
    result: dict = {"outputs_differ_before_training_by": start_difference}
    for name, network in (("psrv_nn", ours), ("torch", theirs)):
        started = time.monotonic()
        spark_net = SparkNetwork(sc, network, sharing_master(batch_size=16, threshold=1e-2))
        spark_net.fit(train, epochs=args.epochs)
        result[f"{name}_accuracy"] = spark_net.evaluate(sc.parallelize(test, 2)).accuracy()
        result[f"{name}_seconds"] = round(time.monotonic() - started, 1)
    result["majority_share"] = float(np.bincount(np.concatenate([ds.label_indices() for ds in test])).max()
                                     / args.test)
    return result


def arguments(argv=None):
    p = parser(__doc__)
    p.add_argument("--epochs", type=int, default=2, help="epochs (default 2)")
    p.add_argument("--train", type=int, default=1600, help="training rows (default 1600)")
    p.add_argument("--test", type=int, default=600, help="test rows (default 600)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = arguments(argv)
    report("psrv.nn vs TorchNetwork (gradient sharing)", run(spark_session("psrv-example-nn-vs-torch"), args),
           args.json)


if __name__ == "__main__":
    main()
