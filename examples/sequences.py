"""Sequence models on Spark with masks: an LSTM tagger (a class per time step) fed by the sequence
pipeline, and an LSTM sequence classifier of variable lengths that reads the features mask.

Tagger: one CSV file per sequence, one line per step (three features, then the step's tag: which feature
is largest); ``read_sequences`` -> ``sequences_to_datasets`` pads each batch to its longest sequence and
gives ``(n, T)`` masks, so the loss and the evaluation count only the real steps.
Classifier: the class is whether the first feature of a sequence's LAST REAL step is positive; the module
takes ``forward(x, mask=None)`` and finds that step from the mask (without it, it would read padding).
Both are ``TorchNetwork``s trained by gradient sharing; ``--model`` picks one or both.

    spark-submit --master local-cluster[2,1,1024] examples/sequences.py
    python examples/sequences.py --model tagger       # local[2]

Needs torch (``pip install psrv[torch]``).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import parser, report, sharing_master, spark_session  # noqa: E402

LONGEST = 8  # steps of the longest sequence


class Tagger(torch.nn.Module):
    """(n, T, 3) features -> (n, T, 3) logits, left to right: the padding after the real steps changes
    nothing for them, so it needs no features mask (the labels mask drops the padded steps)."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm, self.head = torch.nn.LSTM(3, 16, batch_first=True), torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.lstm(x)[0])


class LastStep(torch.nn.Module):
    """(n, T, 2) features -> (n, 2) logits from the LSTM's state at each sequence's last real step."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm, self.head = torch.nn.LSTM(2, 16, batch_first=True), torch.nn.Linear(16, 2)

    def forward(self, x, mask=None):  # mask: the features mask (n, T); None when psrv probes the module
        hidden = self.lstm(x)[0]
        last = mask.sum(dim=1).long() - 1 if mask is not None else torch.full((x.shape[0],), x.shape[1] - 1)
        return self.head(hidden[torch.arange(x.shape[0]), last.clamp(min=0)])


def _adam(parameters):
    return torch.optim.Adam(parameters, lr=1e-2)


def network(module: torch.nn.Module, features: int, seed: int):
    from psrv.nn import TorchNetwork

    torch.manual_seed(seed)
    return TorchNetwork(module, torch.nn.CrossEntropyLoss(), input_shape=(None, features), optimizer=_adam,
                        seed=seed)


def write_tagged_sequences(folder: str, count: int, seed: int) -> None:
    """``count`` CSV files of 2..LONGEST steps; each line: three features, then the largest one's index."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    for i in range(count):
        steps = rng.normal(size=(int(rng.integers(2, LONGEST + 1)), 3))
        with open(os.path.join(folder, f"{i:05d}.csv"), "w") as f:
            f.writelines(",".join(f"{v:.5f}" for v in row) + f",{int(row.argmax())}\n" for row in steps)


def classifier_batches(count: int, batch_size: int, seed: int) -> list:
    """DataSets of sequences of 2..LONGEST steps, each batch padded to its longest, with features masks."""
    from psrv.nn import DataSet

    rng = np.random.default_rng(seed)
    out = []
    for start in range(0, count, batch_size):
        n = min(batch_size, count - start)
        lengths = rng.integers(2, LONGEST + 1, size=n)
        mask = (np.arange(int(lengths.max()))[None, :] < lengths[:, None]).astype(np.float32)
        x = rng.normal(size=(*mask.shape, 2)).astype(np.float32) * mask[:, :, None]
        labels = (x[np.arange(n), lengths - 1, 0] > 0).astype(np.int64)
        out.append(DataSet(x, np.eye(2, dtype=np.float32)[labels], features_mask=mask))
    return out


def train_tagger(sc, args) -> dict:
    from psrv.spark import SparkNetwork
    from psrv.spark.data import read_sequences, sequences_to_datasets

    def batches(folder: str, size: int):
        sequences = read_sequences(folder, spark_context=sc, min_partitions=2)
        return sequences_to_datasets(sequences, batch_size=size, label_index=3, num_classes=3)

    train, test = os.path.join(args.work, "tagger-train"), os.path.join(args.work, "tagger-test")
    write_tagged_sequences(train, args.sequences, args.seed)
    write_tagged_sequences(test, args.sequences, args.seed + 1)
    master = sharing_master(batch_size=16, threshold=1e-2)  # about Adam's step
    spark_net = SparkNetwork(sc, network(Tagger(), 3, args.seed), master)
    spark_net.fit(batches(train, 16), epochs=args.epochs)
    evaluation = spark_net.evaluate(batches(test, 64))  # one row per real step: the padding is dropped
    return {"tagger_step_accuracy": evaluation.accuracy(),
            "tagger_steps_evaluated": int(evaluation.confusion_matrix().sum()), "tagger_test": test}


def train_classifier(sc, args) -> dict:
    from psrv.spark import SparkNetwork

    train = sc.parallelize(classifier_batches(args.sequences, 16, args.seed), 2)
    test = classifier_batches(args.sequences, 64, args.seed + 1)
    master = sharing_master(batch_size=16, threshold=1e-2)
    spark_net = SparkNetwork(sc, network(LastStep(), 2, args.seed), master)
    spark_net.fit(train, epochs=args.epochs)
    evaluation = spark_net.evaluate(sc.parallelize(test, 2))
    positive = float(np.mean([ds.labels[:, 1].mean() for ds in test]))
    return {"classifier_accuracy": evaluation.accuracy(), "classifier_positive_share": positive}


def run(spark, args) -> dict:
    started, result = time.monotonic(), {}
    if args.model in ("tagger", "both"):
        result.update(train_tagger(spark.sparkContext, args))
    if args.model in ("classifier", "both"):
        result.update(train_classifier(spark.sparkContext, args))
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def arguments(argv=None):
    p = parser(__doc__)
    p.add_argument("--model", choices=("tagger", "classifier", "both"), default="both",
                   help="which model to train (default both)")
    p.add_argument("--epochs", type=int, default=4, help="epochs (default 4)")
    p.add_argument("--sequences", type=int, default=256, help="training (and test) sequences (default 256)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = arguments(argv)
    with tempfile.TemporaryDirectory(prefix="psrv-sequences-") as temporary:
        args.work = args.work or temporary
        report("sequence models (gradient sharing)", run(spark_session("psrv-example-sequences"), args),
               args.json)


if __name__ == "__main__":
    main()
