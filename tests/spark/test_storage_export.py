"""Exports through the storage layer on a real local-cluster: reuse across fits, deletion rules, the
default location's multi-host rule, fit_paths and loaders over file:// URIs (also via fsspec)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from psrv.nn import Adam, Dense, Network, Output
from psrv.nn.data import DataSet, FileDataSetLoader
from psrv.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster, SparkNetwork, storage
from psrv.spark.data.export import default_export_base, executor_hosts
from psrv.spark.errors import ExportUnreachableError

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]  # several fits on a shared 2-core machine


def _network() -> Network:
    return Network([Dense(32, "relu"), Output(10)], input_shape=(64,), updater=Adam(1e-2), seed=5)


def _files_under(directory: str) -> dict[str, float]:
    root = storage.local_path(directory)
    return {os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime_ns
            for d, _, files in os.walk(root) for f in files}


def test_second_fit_reuses_the_export_and_close_removes_it(spark_context, digits) -> None:
    train, _ = digits
    rdd = spark_context.parallelize(list(train.batches(32)), 4)
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=32, averaging_frequency=10)
    net = SparkNetwork(spark_context, _network(), master)
    net.fit(rdd)
    first = master._exports.stats()
    assert first["exports_written"] == 1 and first["files_written"] > 0
    (export,) = master._exports._exports.values()
    written = _files_under(export.directory)
    assert len(written) == first["files_written"]

    after_first = net.get_network().params.copy()
    net.fit(rdd)  # same RDD, batch size and partitioning: trains from the files already there
    second = master._exports.stats()
    assert second["exports_written"] == 1 and second["files_written"] == first["files_written"]
    assert second["reused"] == 1
    assert _files_under(export.directory) == written  # nothing rewritten (same names, same mtimes)
    assert net.get_network().epoch == 2 and not np.array_equal(net.get_network().params, after_first)

    other = spark_context.parallelize(list(train.batches(32)), 4)  # another RDD: its own export
    net.fit(other)
    assert master._exports.stats()["exports_written"] == 2

    assert net.delete_temp_files() == 2
    assert not os.path.exists(storage.local_path(export.directory))
    net.fit(rdd)  # after deletion the next fit exports again
    assert master._exports.stats()["exports_written"] == 3
    (again,) = master._exports._exports.values()
    net.close()
    assert not os.path.exists(storage.local_path(again.directory))


def test_a_user_export_directory_is_never_deleted(spark_context, digits, tmp_path: Path) -> None:
    train, _ = digits
    rdd = spark_context.parallelize(list(train.batches(64)), 2)
    target = "file://" + str(tmp_path / "mine")
    master = SharedTrainingMaster(batch_size_per_worker=32, export_directory=target)
    with SparkNetwork(spark_context, _network(), master) as net:
        net.fit(rdd)
        net.fit(rdd)
        assert master._exports.stats()["exports_written"] == 1
        files = _files_under(target)
        assert files and all(p.endswith(".psds") for p in files)
        assert net.delete_temp_files() == 0
    assert _files_under(target) == files  # closed: the user's files are all still there


def test_dataframe_refit_reuses_the_export(spark, spark_context, digits) -> None:
    train, _ = digits
    rows = [(features.tolist(), int(label)) for features, label in
            zip(train.features, train.label_indices(), strict=True)]
    frame = spark.createDataFrame(rows, ["features", "label"]).repartition(2)
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=32, averaging_frequency=10)
    with SparkNetwork(spark_context, _network(), master) as net:
        net.fit(frame)
        net.fit(frame)
        assert master._exports.stats()["exports_written"] == 1 and master._exports.stats()["reused"] == 1


def test_default_export_location_rules(spark_context, tmp_path: Path) -> None:
    # this local-cluster: one host, file:// default file system -> the driver's temporary directory
    assert len(executor_hosts(spark_context)) == 1
    assert storage.is_local(default_export_base(spark_context))
    # several hosts on a file://-only cluster: refused, naming both fixes
    with pytest.raises(ExportUnreachableError, match='export_directory.*rdd_training_approach="direct"'):
        default_export_base(spark_context, hosts={"10.0.0.1", "10.0.0.2"}, default_filesystem="file:///")
    # a default file system tasks can reach (fsspec's memory:// stands in for hdfs:// here)
    assert default_export_base(spark_context, hosts={"a", "b"}, default_filesystem="memory://") == \
        "memory:///tmp/psrv-export"
    # one nobody here can reach: refused on several hosts, the local temp dir on one
    with pytest.raises(ExportUnreachableError, match="export_directory"):
        default_export_base(spark_context, hosts={"a", "b"}, default_filesystem="nosuchfs://nn:8020")
    assert storage.is_local(default_export_base(spark_context, hosts={"a"},
                                                default_filesystem="nosuchfs://nn:8020"))


@pytest.fixture(params=["file-uri", "fsspec-file"])
def uri_root(request, tmp_path: Path):
    saved = storage.current_options()
    if request.param == "fsspec-file":
        storage.configure({**saved, "file": {}})  # every read and write below goes through fsspec
    try:
        yield "file://" + str(tmp_path)
    finally:
        storage.configure(saved)


def test_export_fit_paths_and_evaluate_over_uris(spark_context, digits, uri_root: str) -> None:
    """batch_and_export writes in the tasks, fit_paths and evaluate_paths read in the tasks through
    FileDataSetLoader.load_stream, the network and the evaluation are saved and loaded back."""
    from psrv.spark.data import batch_and_export, list_paths

    train, test = digits
    paths = batch_and_export(spark_context.parallelize(list(train.batches(50)), 2), 16,
                             storage.join(uri_root, "export"))
    assert paths and all(p.startswith("file:///") for p in paths)
    assert list_paths(spark_context, storage.join(uri_root, "export")) == paths
    assert DataSet.merge(FileDataSetLoader().load(p) for p in paths).num_examples == train.num_examples

    master = ParameterAveragingTrainingMaster(batch_size_per_worker=16, averaging_frequency=10)
    net = SparkNetwork(spark_context, _network(), master)
    for _ in range(2):
        net.fit_paths(spark_context.parallelize(paths, 2))
    test_paths = batch_and_export(spark_context.parallelize([test], 2), 64, storage.join(uri_root, "test"))
    evaluation = net.evaluate_paths(spark_context.parallelize(test_paths, 2))
    assert evaluation.accuracy() > 0.85
    net.save_evaluations([evaluation], storage.join(uri_root, "eval", "e.json"))
    loaded = net.load_evaluations(storage.join(uri_root, "eval", "e.json"))
    assert loaded[0].accuracy() == evaluation.accuracy()
    net.get_network().save(storage.join(uri_root, "models", "net.psrv"))
    back = Network.load(storage.join(uri_root, "models", "net.psrv"))
    np.testing.assert_array_equal(back.params, net.get_network().params)


def test_driver_jvm_hadoop_backend_round_trip(spark_context, tmp_path: Path) -> None:
    """The driver-only fallback (Spark's Hadoop FileSystem through py4j) on file:// URIs."""
    from psrv.spark.errors import StorageError

    jvm = storage.JvmHadoopStorage(spark_context)
    root = "file://" + str(tmp_path)
    with jvm.open_write(storage.join(root, "a", "x.bin")) as handle:
        handle.write(b"through the JVM")
    with jvm.open_write(storage.join(root, "a", "x.bin")) as handle:  # replaced by rename
        handle.write(b"replaced")
    with jvm.open_read(storage.join(root, "a", "x.bin")) as stream:
        assert stream.read() == b"replaced"
    with jvm.open_write(storage.join(root, "a", "_SUCCESS")) as handle:
        handle.write(b"")
    assert jvm.is_dir(storage.join(root, "a")) and jvm.exists(storage.join(root, "a", "x.bin"))
    assert jvm.list_files(storage.join(root, "a"), True) == [storage.join(root, "a", "x.bin")]
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert [n for n in names if not n.endswith(".crc")] == ["_SUCCESS", "x.bin"]  # Hadoop's .crc aside
    assert not any(".psrv-" in n for n in names)  # the temporary file was renamed, nothing left
    jvm.delete(storage.join(root, "a"), True)
    assert not (tmp_path / "a").exists()
    with pytest.raises(StorageError, match="nosuchscheme://h/x.*fsspec"):
        storage.read_bytes("nosuchscheme://h/x")  # the driver falls back to the JVM, which refuses
