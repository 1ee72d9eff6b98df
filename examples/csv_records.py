"""CSV -> records -> DataSets -> gradient sharing, with the test accuracy after each epoch.

Writes a CSV of three overlapping classes (four numeric columns, then the class index; a header line),
reads it on the executors (``read_csv``: one record of numbers per line), batches the records into
DataSets (``records_to_datasets``: the last column one-hot over three classes) and trains a small
``psrv.nn`` network by gradient sharing (``SharedTrainingMaster``), evaluating the test file after every
epoch (``fit(..., validation_data=...)``).

    spark-submit --master local-cluster[2,1,1024] examples/csv_records.py
    python examples/csv_records.py --epochs 10        # local[2]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import parser, report, sharing_master, spark_session  # noqa: E402

CENTRES = np.array([[0.0, 0.0, 0.0, 0.0], [1.5, 1.0, -1.0, 0.5], [-1.0, 1.5, 1.0, -1.0]])


def write_csv(path: str, rows: int, seed: int) -> None:
    """``rows`` lines ``f0,f1,f2,f3,label`` after a header: a noisy draw around one of three centres."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(len(CENTRES), size=rows)
    features = CENTRES[labels] + rng.normal(0.0, 0.9, (rows, CENTRES.shape[1]))
    with open(path, "w") as f:
        f.write("f0,f1,f2,f3,label\n")
        for x, y in zip(features, labels, strict=True):
            f.write(",".join(f"{v:.5f}" for v in x) + f",{y}\n")


def run(spark, args) -> dict:
    from psrv.nn import Adam, Dense, Network, Output
    from psrv.spark import SparkNetwork
    from psrv.spark.data import read_csv, records_to_datasets

    sc = spark.sparkContext
    train_csv, test_csv = os.path.join(args.work, "train.csv"), os.path.join(args.work, "test.csv")
    write_csv(train_csv, args.train, args.seed)
    write_csv(test_csv, args.test, args.seed + 1)

    def datasets(path: str):
        records = read_csv(path, spark_context=sc, min_partitions=2, skip_lines=1)
        return records_to_datasets(records, batch_size=32, label_index=-1, num_classes=len(CENTRES))

    network = Network([Dense(32, activation="relu"), Output(len(CENTRES))], input_shape=(4,),
                      updater=Adam(1e-2), seed=args.seed)
    started = time.monotonic()
    spark_net = SparkNetwork(sc, network, sharing_master(batch_size=16))
    spark_net.fit(datasets(train_csv), epochs=args.epochs, validation_data=datasets(test_csv))
    for record in spark_net.history:
        print(f"epoch {record.epoch}: loss {record.metrics['loss']:.4f}, "
              f"test accuracy {record.metrics['val_accuracy']:.4f}")
    return {"test_accuracy": spark_net.history[-1].metrics["val_accuracy"],
            "accuracy_per_epoch": [r.metrics["val_accuracy"] for r in spark_net.history],
            "test_csv": test_csv, "seconds": round(time.monotonic() - started, 1)}


def arguments(argv=None):
    p = parser(__doc__)
    p.add_argument("--epochs", type=int, default=2, help="epochs (default 2)")
    p.add_argument("--train", type=int, default=1200, help="training rows (default 1200)")
    p.add_argument("--test", type=int, default=600, help="test rows (default 600)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = arguments(argv)
    with tempfile.TemporaryDirectory(prefix="psrv-csv-") as temporary:
        args.work = args.work or temporary
        report("CSV records (gradient sharing)", run(spark_session("psrv-example-csv"), args), args.json)


if __name__ == "__main__":
    main()
