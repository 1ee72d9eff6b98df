"""Time to reach a test accuracy on scikit-learn's digits: gradient sharing on Spark vs one process.

For each worker count (default 1 and 2) a fresh ``local-cluster[W,1,1024]`` Spark session is
started (real executor processes); the same network (Dense(256, relu) -> softmax, Adam 1e-2) is
trained one epoch per ``fit`` with SharedTrainingMaster until its test accuracy reaches the target
(default 0.95) or --max-epochs pass. Beside it, in the same run, single-process training of the
same network (``Network.fit``, same batch size) is timed to the same target. Times exclude the
Spark session start-up; each figure is the median of --runs runs. Bytes per step are the encoded
update bytes workers sent divided by the steps, beside the dense parameter vector's size.

``--storage`` measures the data paths instead (parameter averaging, export approach), on digits
and on a synthetic set (--synthetic-rows x 100 features, generated in the tasks):
- later fits of the same RDD with the export reused vs re-exported every fit (as before reuse:
  ``delete_temp_files()`` before each fit), median seconds per fit after the first;
- one evaluation pass and one fit over a Parquet DataFrame (Arrow batches read in the tasks) vs
  the same data as .psds minibatch files (``evaluate_paths`` / ``fit_paths``);
- ``NetworkEstimator.fit`` (psrv.spark.ml) from the Parquet DataFrame (its files read in the tasks),
  from a computed DataFrame through ``mapInArrow``, and from that DataFrame through Spark's rows (the
  baseline: how the estimators read every DataFrame before), with the speed-up against the rows;
  ``TorchModel.transform`` of that DataFrame with the Arrow UDF vs Spark's rows.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from unittest import mock

import numpy as np
from psrv.encoding import AdaptiveThreshold
from psrv.nn import Adam, Dense, Network, Output
from psrv.nn.data import DataSet
from psrv.spark import (
    ParameterAveragingTrainingMaster,
    SharedTrainingMaster,
    SparkNetwork,
    VoidConfiguration,
    storage,
)
from psrv.spark.data import batch_and_export, parquet
from psrv.spark.ml import NetworkEstimator


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="one run per configuration and a 0.90 target (a smoke run, noisier figures)")
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts (default 1,2)")
    parser.add_argument("--target", type=float, default=None, help="test accuracy to reach (default 0.95)")
    parser.add_argument("--runs", type=int, default=None, help="runs per configuration, median reported "
                        "(default 3; --quick: 1)")
    parser.add_argument("--max-epochs", type=int, default=30,
                        help="give up after this many epochs (default 30)")
    parser.add_argument("--batch-size", type=int, default=16, help="examples per minibatch (default 16)")
    parser.add_argument("--mesh", choices=("plain", "mesh"), default="plain",
                        help="mesh mode (default plain)")
    parser.add_argument("--approach", choices=("export", "direct"), default="direct",
                        help="rdd_training_approach (default direct)")
    parser.add_argument("--master-template", default="local-cluster[{w},1,1024]",
                        help="Spark master per worker count, {w} replaced "
                        "(default local-cluster[{w},1,1024])")
    parser.add_argument("--storage", action="store_true",
                        help="benchmark the data paths (export reuse, Parquet vs .psds) instead")
    parser.add_argument("--synthetic-rows", type=int, default=1_000_000,
                        help="rows of the synthetic set for --storage (default 1000000; 0 skips it)")
    parser.add_argument("--storage-workers", type=int, default=2,
                        help="executors for --storage (local-cluster[W,1,2048], default 2)")
    args = parser.parse_args(argv)
    args.target = args.target if args.target is not None else (0.90 if args.quick else 0.95)
    args.runs = args.runs if args.runs is not None else (1 if args.quick else 3)
    return args


def digits_data(seed: int = 42):
    from sklearn.datasets import load_digits

    digits = load_digits()
    features = (digits.data / 16.0).astype(np.float32)
    data = DataSet.from_class_indices(features, digits.target.astype(np.int64), 10)
    return data.split(0.75, seed=seed)


def digits_network(seed: int):
    layers = [Dense(256, activation="relu"), Output(10)]
    return Network(layers, input_shape=(64,), updater=Adam(1e-2), seed=seed)


def _single_process(args: argparse.Namespace, train, test, seed: int) -> dict:
    network = digits_network(seed)
    started = time.perf_counter()
    for epoch in range(1, args.max_epochs + 1):
        network.fit(train, epochs=1, batch_size=args.batch_size)
        if network.evaluate(test).accuracy() >= args.target:
            return {"seconds": time.perf_counter() - started, "epochs": epoch, "reached": True}
    return {"seconds": time.perf_counter() - started, "epochs": args.max_epochs, "reached": False}


def _gradient_sharing(args: argparse.Namespace, sc, workers: int, train, test, seed: int) -> dict:
    network = digits_network(seed)
    master = SharedTrainingMaster(VoidConfiguration(unicast_port=0, mesh_build_mode=args.mesh),
                                  batch_size_per_worker=args.batch_size, num_workers=workers,
                                  threshold_algorithm=AdaptiveThreshold(3e-2),
                                  rdd_training_approach=args.approach)
    spark_net = SparkNetwork(sc, network, master)
    rdd = sc.parallelize(list(train.batches(50)), workers).cache()
    rdd.count()
    steps = sent = 0
    started = time.perf_counter()
    reached, epochs = False, 0
    while epochs < args.max_epochs:
        epochs += 1
        spark_net.fit(rdd)
        steps += master.last_fit["steps"]
        sent += master.last_fit["bytes_sent"]
        if network.evaluate(test).accuracy() >= args.target:
            reached = True
            break
    seconds = time.perf_counter() - started
    rdd.unpersist()
    return {"seconds": seconds, "epochs": epochs, "reached": reached,
            "bytes_per_step": sent / max(1, steps), "dense_bytes": network.num_params * 4}


def spark_session(master: str, workers: int):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    import pyspark
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_HOME", os.path.dirname(os.path.abspath(pyspark.__file__)))
    session = (SparkSession.builder.master(master).appName("psrv-bench-spark")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.default.parallelism", str(workers)).getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    deadline = time.monotonic() + 120
    while session.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1 < workers \
            and master.startswith("local-cluster") and time.monotonic() < deadline:
        time.sleep(0.2)
    return session


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


# --------------------------------------------------------------------------------------------------
# --storage: export reuse, Parquet vs .psds
# --------------------------------------------------------------------------------------------------
_SYNTHETIC_FEATURES = 100
_SYNTHETIC_CLASSES = 10


def _synthetic_partition(rows_per_partition: int):
    """Task side: one partition's rows of the synthetic set (features ~ N(0,1), labels from a fixed
    linear map), as DataSets of 4096 rows."""

    def generate(index: int, _items):
        weights = np.random.default_rng(7).normal(size=(_SYNTHETIC_FEATURES, _SYNTHETIC_CLASSES))
        rng = np.random.default_rng(1000 + index)
        left = rows_per_partition
        while left > 0:
            n = min(4096, left)
            x = rng.normal(size=(n, _SYNTHETIC_FEATURES)).astype(np.float32)
            yield DataSet.from_class_indices(x, np.argmax(x @ weights, axis=1), _SYNTHETIC_CLASSES)
            left -= n

    return generate


def _write_parquet_partition(directory: str):
    """Task side: a partition's DataSets as one Parquet file (features array<float>, label long)."""

    def write(index: int, items):
        import pyarrow as pa
        import pyarrow.parquet as pq

        tables = []
        for data in items:
            flat = pa.array(data.features.reshape(-1))
            features = pa.ListArray.from_arrays(
                pa.array(np.arange(0, len(flat) + 1, data.features.shape[1], dtype=np.int32)), flat)
            tables.append(pa.table({"features": features, "label": pa.array(data.label_indices())}))
        if tables:
            with storage.open_output(storage.join(directory, f"part-{index:05d}.parquet")) as out:
                pq.write_table(pa.concat_tables(tables), out)
        yield len(tables)

    return write


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _storage_case(sc, spark, name: str, rdd, features: int, batch: int, fits: int, workdir: str,
                  frequency: int = 10) -> list:
    def net() -> SparkNetwork:
        network = Network([Dense(32, "relu"), Output(10)], input_shape=(features,), updater=Adam(1e-3),
                          seed=1)
        return SparkNetwork(sc, network, ParameterAveragingTrainingMaster(batch_size_per_worker=batch,
                                                                         averaging_frequency=frequency))

    rows = []
    times = {}
    for mode in ("re-exported every fit (before)", "export reused"):
        spark_net = net()
        spark_net.fit(rdd)  # the first fit exports in both modes
        later = []
        for _ in range(fits - 1):
            if mode.startswith("re-exported"):
                spark_net.delete_temp_files()
            later.append(_timed(lambda: spark_net.fit(rdd)))  # noqa: B023 - called at once
        written = spark_net.training_master._exports.stats()["files_written"]
        spark_net.close()
        times[mode] = statistics.median(later)
        rows.append((f"{name}: later fit, {mode}", times[mode], written))
        print("row:", rows[-1], flush=True)
    parquet_dir = os.path.join(workdir, f"{name}-parquet")
    rdd.mapPartitionsWithIndex(_write_parquet_partition(parquet_dir)).collect()
    frame = spark.read.parquet(parquet_dir)
    psds = batch_and_export(rdd, batch, os.path.join(workdir, f"{name}-psds"))
    paths = sc.parallelize(psds, max(1, sc.defaultParallelism))
    spark_net = net()
    eval_psds = statistics.median(_timed(lambda: spark_net.evaluate_paths(paths)) for _ in range(3))
    eval_parquet = statistics.median(_timed(lambda: spark_net.evaluate(frame)) for _ in range(3))
    fit_psds = statistics.median(_timed(lambda: spark_net.fit_paths(paths)) for _ in range(fits - 1))
    fit_parquet = statistics.median(_timed(lambda: spark_net.fit(frame)) for _ in range(fits - 1))
    rows += [(f"{name}: evaluation pass, .psds files", eval_psds, None),
             (f"{name}: evaluation pass, Parquet DataFrame", eval_parquet, None),
             (f"{name}: fit, .psds files (fit_paths)", fit_psds, None),
             (f"{name}: fit, Parquet DataFrame", fit_parquet, None)]
    for row in rows[-4:]:
        print("row:", row, flush=True)
    rows += _estimator_case(spark, name, frame, features, batch, fits, frequency)
    return rows


def _estimator_case(spark, name: str, frame, features: int, batch: int, fits: int, frequency: int) -> list:
    """NetworkEstimator.fit on the same data three ways: the Parquet DataFrame read from its files in the
    tasks, a non-Parquet DataFrame (a filter over it) through mapInArrow, and that DataFrame through
    Spark's rows (what every estimator fit did before the Arrow paths: the baseline)."""
    def estimator() -> NetworkEstimator:
        network = Network([Dense(32, "relu"), Output(10)], input_shape=(features,), updater=Adam(1e-3),
                          seed=1)
        master = ParameterAveragingTrainingMaster(batch_size_per_worker=batch, averaging_frequency=frequency)
        return NetworkEstimator(network, training_master=master)

    models = []

    def fit(data, expected: str) -> float:
        fitted = estimator()
        seconds = _timed(lambda: models.append(fitted.fit(data)))
        assert fitted.last_input_path == expected, (fitted.last_input_path, expected)
        return seconds

    def later_fits(data, expected: str) -> float:
        """The median of the fits after the first (the first also starts the Python workers' imports:
        pandas and pyarrow for mapInArrow)."""
        return statistics.median([fit(data, expected) for _ in range(fits)][1:])

    other = frame.filter("label >= 0")  # not a plain scan: Spark computes it
    times = {"Parquet DataFrame, Arrow from its files": later_fits(frame, "parquet")}
    times["other DataFrame, Arrow through mapInArrow"] = later_fits(other, "arrow")
    with mock.patch.object(parquet, "arrow_datasets", lambda *a, **k: None):
        times["other DataFrame, Spark's rows (before)"] = later_fits(other, "rows")
    base = times["other DataFrame, Spark's rows (before)"]
    rows = [(f"{name}: NetworkEstimator.fit, {case} [{base / seconds:.2f}x]", seconds, None)
            for case, seconds in times.items()]
    rows += _transform_case(name, models[-1], other)
    for row in rows:
        print("row:", row, flush=True)
    return rows


def _transform_case(name: str, model, frame) -> list:
    """TorchModel.transform over the computed DataFrame: the scalar Arrow UDF vs Spark's rows (before);
    the median of 3 passes after one warm-up pass each (a sum over the prediction column forces them)."""
    from pyspark.sql import functions as F

    def score(use_arrow: bool) -> float:
        model.use_arrow = use_arrow
        passes = [_timed(lambda: model.transform(frame).select(F.sum(model.prediction_col)).collect())
                  for _ in range(4)]
        assert model.last_transform_path == ("arrow" if use_arrow else "rows")
        return statistics.median(passes[1:])

    arrow, before = score(True), score(False)
    return [(f"{name}: TorchModel.transform, Arrow UDF [{before / arrow:.2f}x]", arrow, None),
            (f"{name}: TorchModel.transform, Spark's rows (before) [1.00x]", before, None)]


def _storage_main(args: argparse.Namespace) -> int:
    workers = args.storage_workers
    session = spark_session(f"local-cluster[{workers},1,2048]", workers)
    sc = session.sparkContext
    fits = 3 if args.quick else 4
    rows = []
    with tempfile.TemporaryDirectory(prefix="psrv-bench-storage-") as workdir:
        try:
            train, _ = digits_data()
            digits = sc.parallelize(list(train.batches(50)), workers).cache()
            digits.count()
            rows += _storage_case(sc, session, "digits", digits, 64, 16, fits, workdir)
            if args.synthetic_rows > 0:
                per = args.synthetic_rows // (workers * 2)
                synthetic = sc.parallelize(range(workers * 2), workers * 2) \
                    .mapPartitionsWithIndex(_synthetic_partition(per)).cache()
                synthetic.count()
                name = f"synthetic-{per * workers * 2}x{_SYNTHETIC_FEATURES}"
                rows += _storage_case(sc, session, name, synthetic, _SYNTHETIC_FEATURES, 256, fits, workdir,
                                      frequency=50)
        finally:
            session.stop()
    print(f"\nlocal-cluster[{workers},1,2048], parameter averaging (export approach); medians of "
          f"{fits - 1} later fits / 3 evaluation passes")
    print("| case | seconds | files written by the master |")
    print("|---|---|---|")
    for name, seconds, written in rows:
        print(f"| {name} | {seconds:.2f} | {'' if written is None else written} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.storage:
        return _storage_main(args)
    train, test = digits_data()
    worker_counts = [int(w) for w in args.workers.split(",") if w.strip()]
    print(f"digits: {train.num_examples} train / {test.num_examples} test; target test accuracy "
          f"{args.target}; batch {args.batch_size}; median of {args.runs} run(s)")
    baseline = [_single_process(args, train, test, seed) for seed in range(args.runs)]
    rows = [("single process", _median(baseline, "seconds"), _median(baseline, "epochs"),
             all(r["reached"] for r in baseline), None, None)]
    for workers in worker_counts:
        session = spark_session(args.master_template.format(w=workers), workers)
        try:
            # warm-up: numba kernels and Python workers on the executors
            _gradient_sharing(args, session.sparkContext, workers, train, test, 99)
            runs = [_gradient_sharing(args, session.sparkContext, workers, train, test, seed)
                    for seed in range(args.runs)]
        finally:
            session.stop()
        rows.append((f"gradient sharing, {workers} worker(s)", _median(runs, "seconds"),
                     _median(runs, "epochs"), all(r["reached"] for r in runs),
                     _median(runs, "bytes_per_step"), runs[0]["dense_bytes"]))
    base = rows[0][1]
    print(f"\n| configuration | time to {args.target:.2f} (s) | vs single process | epochs | bytes/step "
          "(dense) |")
    print("|---|---|---|---|---|")
    for name, seconds, epochs, reached, per_step, dense in rows:
        mark = "" if reached else " (not reached)"
        cost = "" if per_step is None else f"{per_step:,.0f} ({dense:,})"
        print(f"| {name} | {seconds:.2f}{mark} | {seconds / base:.1f}x | {epochs:g} | {cost} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
