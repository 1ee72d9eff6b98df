"""`psrv demo`: train a small network on scikit-learn's digits with gradient sharing on local Spark.

What a newcomer runs first: it starts Spark, a controller on the driver and one node per
worker task, trains for a few epochs with a progress bar (loss and test accuracy), prints the
final accuracy and what the updates cost against dense parameter exchange, and saves the network.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Any

import numpy as np
from psrv.encoding import AdaptiveThreshold
from psrv.nn import Adam, Dense, Network, Output
from psrv.nn.data import DataSet
from psrv.spark.config import VoidConfiguration
from psrv.spark.driver.java import java_problem
from psrv.spark.driver.network import SparkNetwork
from psrv.spark.driver.shared_training import SharedTrainingMaster
from psrv.spark.errors import SparkConfigError
from psrv.spark.observe.metrics import TensorBoardLogger, log_validation
from psrv.spark.observe.report import export_stats_html
from psrv.spark.observe.stats import validation_sample
from psrv.spark.observe.trace import export_chrome_trace

__all__ = ["add_parser", "run"]

log = logging.getLogger(__name__)


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="train on the digits data with gradient sharing on local Spark",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--workers", type=int, default=2,
                        help="Spark tasks training at once (and local[N] cores)")
    parser.add_argument("--epochs", type=int, default=10, help="passes over the training data (at most)")
    parser.add_argument("--master", default=None, help="Spark master URL (default: local[WORKERS])")
    parser.add_argument("--batch-size", type=int, default=16, help="examples per minibatch per worker")
    parser.add_argument("--mesh", choices=("plain", "mesh"), default="plain", help="mesh build mode")
    parser.add_argument("--approach", choices=("export", "direct"), default="export",
                        help="train from exported minibatch files or straight from the RDD")
    parser.add_argument("--threshold", type=float, default=3e-2,
                        help="initial threshold of the adaptive threshold algorithm")
    parser.add_argument("--learning-rate", type=float, default=1e-2, help="Adam learning rate")
    parser.add_argument("--hidden", type=int, default=256, help="units of the hidden dense layer")
    parser.add_argument("--port", type=int, default=0,
                        help="controller port on the driver (0 = any free port)")
    parser.add_argument("--network-mask", default=None,
                        help="CIDR choosing the interface to bind (default: loopback)")
    parser.add_argument("--target-accuracy", type=float, default=None,
                        help="stop early once the test accuracy reaches this (e.g. 0.95)")
    parser.add_argument("--output", default="psrv-demo-network.psrv",
                        help="where to save the trained network")
    parser.add_argument("--seed", type=int, default=42, help="seed of the network and the data split")
    parser.add_argument("--report", default=None, metavar="DIR",
                        help="write the run's HTML report, Chrome/Perfetto trace and TensorBoard log to DIR")
    parser.set_defaults(func=run)


def _spark_session(master: str, workers: int) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName("psrv-demo")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.default.parallelism", str(workers)))
    if master.startswith("local"):
        builder = (builder.config("spark.driver.host", "127.0.0.1")
                   .config("spark.driver.bindAddress", "127.0.0.1"))
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def run(args: argparse.Namespace) -> int:
    from sklearn.datasets import load_digits
    from tqdm import tqdm

    if args.workers < 1 or args.epochs < 1 or args.batch_size < 1:
        print("psrv demo: --workers, --epochs and --batch-size must be >= 1", file=sys.stderr)
        return 2
    master = args.master or f"local[{args.workers}]"
    problem = java_problem()
    if problem is not None:
        print(f"psrv demo: {problem}", file=sys.stderr)
        return 2
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        # joins and leaves of every epoch would bury the progress bar; --log-level DEBUG shows them
        for name in ("psrv.transport", "psrv.spark", "py4j"):
            logging.getLogger(name).setLevel(logging.WARNING)
    digits = load_digits()
    features = (digits.data / 16.0).astype(np.float32)
    data = DataSet.from_class_indices(features, digits.target.astype(np.int64), 10)
    train, test = data.split(0.75, seed=args.seed)
    print(f"psrv demo: {train.num_examples} training / {test.num_examples} test digits, "
          f"{args.workers} workers on {master}, mesh {args.mesh}, approach {args.approach}")
    started = time.monotonic()
    session = _spark_session(master, args.workers)
    try:
        sc = session.sparkContext
        network = Network([Dense(args.hidden, activation="relu"), Output(10)], input_shape=(64,),
                          updater=Adam(args.learning_rate), seed=args.seed)
        conf = VoidConfiguration(unicast_port=args.port, network_mask=args.network_mask,
                                 mesh_build_mode=args.mesh)
        watch = _Watch(args.report)
        tm = SharedTrainingMaster(conf, batch_size_per_worker=args.batch_size, num_workers=args.workers,
                                  threshold_algorithm=AdaptiveThreshold(args.threshold),
                                  rdd_training_approach=args.approach, collect_training_stats=watch.on,
                                  loggers=watch.loggers, progress=False)  # the epoch bar below shows it
        spark_net = SparkNetwork(sc, network, tm)
        rdd = sc.parallelize(list(train.batches(50)), args.workers)
        sent = dense = 0
        accuracy = 0.0
        # the bar on stderr, the results (bar.write) on stdout: `psrv demo > log` keeps only results
        with tqdm(total=args.epochs, desc="training", unit="epoch", file=sys.stderr) as bar:
            for epoch in range(args.epochs):
                spark_net.fit(rdd)
                sent += tm.last_fit["bytes_sent"]
                dense += tm.last_fit["dense_bytes"]
                accuracy = network.evaluate(test).accuracy()
                watch.validation(network, epoch + 1, accuracy)  # 1-based, as the fit's own
                bar.set_postfix(loss=f"{tm.last_score:.4f}", test_accuracy=f"{accuracy:.4f}")
                bar.update(1)
                bar.write(f"epoch {epoch + 1:3d}: loss {tm.last_score:.4f}, test accuracy {accuracy:.4f}, "
                          f"{tm.last_fit['messages']} updates, {tm.last_fit['bytes_sent']:,} bytes, "
                          f"threshold {tm.last_fit['threshold']:.3g}")
                if args.target_accuracy is not None and accuracy >= args.target_accuracy:
                    bar.write(f"reached test accuracy {accuracy:.4f} after {epoch + 1} epochs")
                    break
        network.save(args.output)
    finally:
        session.stop()
        watch.close()
    for line in watch.write(tm.training_stats):
        print(line)
    ratio = dense / sent if sent else float("inf")
    print(f"final test accuracy: {accuracy:.4f}")
    print(f"updates sent: {sent:,} bytes; dense parameter exchange for the same steps: {dense:,} bytes "
          f"({ratio:.0f}x less)")
    print(f"trained network saved to {args.output} ({time.monotonic() - started:.1f} s in all)")
    return 0


class _Watch:
    """What ``--report DIR`` adds to the demo: stats collection, a TensorBoard log (when tensorboard is
    installed), validation accuracy per epoch, and the report files at the end."""

    def __init__(self, directory: str | None) -> None:
        self.directory = os.path.abspath(directory) if directory else None
        self.on = directory is not None
        self.loggers: list[Any] = []
        self.notes: list[str] = []
        self.records: list[dict[str, Any]] = []
        if self.directory is None:
            return
        os.makedirs(self.directory, exist_ok=True)
        try:
            self.loggers.append(TensorBoardLogger(os.path.join(self.directory, "tensorboard")))
        except SparkConfigError as exc:
            self.notes.append(f"no TensorBoard log: {exc}")

    def validation(self, network: Any, epoch: int, accuracy: float) -> None:
        if not self.on:
            return
        log_validation(self.loggers, int(network.iteration), epoch, {"accuracy": accuracy})
        self.records.append(validation_sample(time.time(), int(network.iteration), epoch, accuracy=accuracy))

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()

    def write(self, stats: list[dict[str, Any]]) -> list[str]:
        if self.directory is None:
            return []
        records = list(stats) + self.records
        html = export_stats_html(records, os.path.join(self.directory, "report.html"), title="psrv demo")
        trace = export_chrome_trace(records, os.path.join(self.directory, "trace.json"))
        lines = [f"report: {html}", f"trace (Perfetto, chrome://tracing): {trace}"]
        for logger in self.loggers:
            lines.append(f"TensorBoard log: {logger.log_dir} (tensorboard --logdir {logger.log_dir})")
        return lines + self.notes
