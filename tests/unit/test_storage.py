"""psrv.spark.storage on a real file system: plain paths, file:// URIs, and file:// through fsspec
(the generic backend every non-local scheme uses), with the psrv readers and writers that use it."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from psrv.nn.data import DataSet, FileDataSetLoader
from psrv.spark import storage
from psrv.spark.errors import StorageError


@pytest.fixture(params=["plain", "file-uri", "fsspec-file"])
def root(request, tmp_path: Path):
    """A directory in the three forms; "fsspec-file" routes file:// through FsspecStorage."""
    saved = storage.current_options()
    if request.param == "fsspec-file":
        storage.configure({**saved, "file": {}})
    try:
        yield str(tmp_path) if request.param == "plain" else "file://" + str(tmp_path), request.param
    finally:
        storage.configure(saved)


def test_backend_choice(root) -> None:
    uri, kind = root
    backend = storage.storage_for(uri)
    expected = storage.FsspecStorage if kind == "fsspec-file" else storage.LocalStorage
    assert isinstance(backend, expected)


def test_write_read_list_delete_round_trip(root, tmp_path: Path) -> None:
    uri, _ = root
    target = storage.join(uri, "a", "b", "x.bin")
    storage.write_bytes(target, b"hello")
    assert storage.read_bytes(target) == b"hello"
    storage.write_bytes(target, b"replaced")  # overwrite goes through the same rename
    assert storage.read_bytes(target) == b"replaced"
    storage.write_bytes(storage.join(uri, "a", "_SUCCESS"), b"")
    storage.write_bytes(storage.join(uri, "a", "y.txt"), b"y")
    listed = storage.list_files(storage.join(uri, "a"))
    assert listed == [storage.join(uri, "a", "b", "x.bin"), storage.join(uri, "a", "y.txt")]
    assert storage.list_files(storage.join(uri, "a"), recursive=False) == [storage.join(uri, "a", "y.txt")]
    assert storage.list_files(storage.join(uri, "a"), suffix=".bin") == [target]
    # no temporary file is left behind by any write
    left = [n for _, _, files in os.walk(tmp_path) for n in files if n.startswith(".psrv-")]
    assert left == []
    storage.delete(storage.join(uri, "a"))
    assert not storage.exists(storage.join(uri, "a"))
    storage.delete(storage.join(uri, "a"))  # a missing one is fine


def test_failed_write_leaves_nothing(root, tmp_path: Path) -> None:
    uri, _ = root
    target = storage.join(uri, "partial.bin")
    storage.write_bytes(target, b"old")
    with pytest.raises(RuntimeError), storage.open_output(target) as handle:
        handle.write(b"half of the new")
        raise RuntimeError("crash mid-write")
    assert storage.read_bytes(target) == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["partial.bin"]


def test_missing_file_and_directory_raise_storage_error(root) -> None:
    uri, _ = root
    with pytest.raises(StorageError, match="nope"):
        storage.read_bytes(storage.join(uri, "nope"))
    with pytest.raises(StorageError, match="not a directory"):
        storage.list_files(storage.join(uri, "missing-dir"))
    assert isinstance(StorageError("x"), OSError)


def test_psrv_files_through_every_backend(root) -> None:
    """DataSet, Network and TorchNetwork files, the loaders' streams, the evaluation JSON and the
    stats report: each written and read back through the storage layer."""
    from psrv.nn import Dense, Network, Output
    from psrv.nn.evaluation import Evaluation
    from psrv.spark.driver.evaluation import load_evaluations, save_evaluations
    from psrv.spark.observe.report import export_stats_html

    uri, _ = root
    rng = np.random.default_rng(0)
    data = DataSet.from_class_indices(rng.normal(size=(8, 3)).astype(np.float32), np.arange(8) % 2, 2)
    data.save(storage.join(uri, "d", "batch.psds"))
    assert DataSet.load(storage.join(uri, "d", "batch.psds")).equals(data)
    with storage.open_input(storage.join(uri, "d", "batch.psds")) as stream:
        assert FileDataSetLoader().load_stream(stream, "batch.psds").equals(data)

    net = Network([Dense(4, "relu"), Output(2)], input_shape=(3,), seed=3)
    net.save(storage.join(uri, "n", "net.psrv"))
    back = Network.load(storage.join(uri, "n", "net.psrv"))
    np.testing.assert_array_equal(back.params, net.params)

    evaluation = Evaluation(2)
    evaluation.eval(data.labels, data.labels)
    save_evaluations([evaluation], storage.join(uri, "e", "eval.json"))
    assert load_evaluations(storage.join(uri, "e", "eval.json"))[0].accuracy() == 1.0

    report = export_stats_html([{"worker": "w", "kind": "fit", "start": 0.0, "end": 1.0}],
                               storage.join(uri, "r", "report.html"))
    assert b"psrv-stats" in storage.read_bytes(report)


def test_torch_network_through_storage(root) -> None:
    torch = pytest.importorskip("torch")
    from psrv.nn import TorchNetwork

    uri, _ = root
    net = TorchNetwork(torch.nn.Sequential(torch.nn.Linear(3, 2)), loss=torch.nn.MSELoss(), input_shape=3,
                       seed=1)
    net.save(storage.join(uri, "t", "net.pt"))
    back = TorchNetwork.load(storage.join(uri, "t", "net.pt"))
    np.testing.assert_array_equal(back.params, net.params)


def test_uri_helpers() -> None:
    assert storage.is_local("/a/b") and storage.is_local("file:///a") and not storage.is_local("hdfs:///a")
    assert storage.local_path("file:///a/b") == "/a/b" and storage.local_path("file:/a/b") == "/a/b"
    assert storage.join("hdfs://nn:8020/x/", "y", "z") == "hdfs://nn:8020/x/y/z"
    assert storage.absolute("file:///a/../b") == "file:///b"
    assert storage.absolute("s3a://bucket/k") == "s3a://bucket/k"


def test_unknown_scheme_names_what_to_install() -> None:
    # without a SparkContext: no backend at all; with one (another test's session): the driver's
    # Hadoop file system refuses the scheme. Either way the URI and what to install are named.
    with pytest.raises(StorageError, match=r"nosuchscheme://host/x.*fsspec"):
        storage.read_bytes("nosuchscheme://host/x")
    with pytest.raises(StorageError, match=r"psrv\[storage\]"):
        storage.check_task_access("nosuchscheme://host/x", "export_directory")
