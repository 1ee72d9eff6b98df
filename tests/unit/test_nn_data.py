"""DataSet / MultiDataSet: batching, splitting, shuffling, merging and the versioned file form."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from psrv.nn.data import (
    DATA_FILE_MAGIC,
    DataSet,
    DataSetLoader,
    FileDataSetLoader,
    FileMultiDataSetLoader,
    MultiDataSet,
    MultiDataSetLoader,
    one_hot,
    read_data_file,
)
from psrv.nn.errors import DataError, DataFileError, NNError


def _dataset(n: int = 10, width: int = 3, classes: int = 4, seed: int = 0) -> DataSet:
    rng = np.random.default_rng(seed)
    features = rng.standard_normal((n, width)).astype(np.float32)
    return DataSet.from_class_indices(features, np.arange(n) % classes, classes)


def _row_ids(ds: DataSet) -> list[int]:
    """Every test data set stores the example id in feature column 0."""
    return [int(v) for v in ds.features[:, 0]]


def _numbered(n: int) -> DataSet:
    features = np.stack([np.arange(n), np.arange(n) * 2.0], axis=1).astype(np.float32)
    return DataSet(features, one_hot(np.arange(n) % 3, 3), labels_mask=np.ones(n, np.float32))


# ------------------------------------------------------------------------------------------------
# construction and bad shapes
# ------------------------------------------------------------------------------------------------
def test_from_class_indices_makes_float32_one_hot() -> None:
    ds = DataSet.from_class_indices(np.zeros((3, 2)), np.array([2, 0, 1]), 3)
    assert ds.labels.dtype == np.float32
    np.testing.assert_array_equal(ds.labels, np.eye(3, dtype=np.float32)[[2, 0, 1]])
    np.testing.assert_array_equal(ds.label_indices(), [2, 0, 1])
    assert (ds.num_examples, ds.num_inputs, ds.num_outcomes, len(ds)) == (3, 2, 3, 3)


def test_mismatched_row_counts_name_both_sizes() -> None:
    with pytest.raises(DataError, match=r"features=5, labels=4"):
        DataSet(np.zeros((5, 2)), np.zeros((4, 1)))


def test_bad_mask_shape_is_a_clear_error() -> None:
    with pytest.raises(DataError, match=r"features_mask: expected 3 rows"):
        DataSet(np.zeros((3, 2)), np.zeros((3, 1)), features_mask=np.ones(2))
    with pytest.raises(DataError, match=r"labels_mask"):
        DataSet(np.zeros((3, 4, 2)), np.zeros((3, 4, 1)), labels_mask=np.ones((3, 5)))


def test_non_numeric_or_scalar_input_rejected() -> None:
    with pytest.raises(DataError, match="dtype"):
        DataSet(np.array([["a"], ["b"]]), np.zeros((2, 1)))
    with pytest.raises(DataError, match="scalar"):
        DataSet(np.float32(1.0), np.zeros((1, 1)))


def test_class_indices_out_of_range() -> None:
    with pytest.raises(DataError, match=r"\[0, 3\).*\[0, 5\]"):
        DataSet.from_class_indices(np.zeros((2, 1)), np.array([0, 5]), 3)


def test_errors_derive_from_nn_error_and_value_error() -> None:
    assert issubclass(DataFileError, DataError)
    assert issubclass(DataError, NNError)
    assert issubclass(DataError, ValueError)


# ------------------------------------------------------------------------------------------------
# batching, splitting, shuffling
# ------------------------------------------------------------------------------------------------
def test_batches_cover_every_example_in_order() -> None:
    ds = _numbered(10)
    batches = list(ds.batches(4))
    assert [b.num_examples for b in batches] == [4, 4, 2]
    assert sum((_row_ids(b) for b in batches), []) == list(range(10))
    assert batches[0].labels_mask is not None and batches[0].labels_mask.shape == (4,)
    assert [b.num_examples for b in ds.batches(4, drop_last=True)] == [4, 4]


def test_shuffled_batches_are_a_permutation_and_reproducible() -> None:
    ds = _numbered(25)
    first = sum((_row_ids(b) for b in ds.batches(7, shuffle=True, seed=3)), [])
    again = sum((_row_ids(b) for b in ds.batches(7, shuffle=True, seed=3)), [])
    assert sorted(first) == list(range(25))
    assert first == again
    assert first != list(range(25))


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_bad_batch_size(bad: object) -> None:
    with pytest.raises(DataError, match="batch_size"):
        list(_numbered(3).batches(bad))  # type: ignore[arg-type]


def test_split_sizes_and_disjointness() -> None:
    ds = _numbered(10)
    train, test = ds.split(0.7, seed=1)
    assert (train.num_examples, test.num_examples) == (7, 3)
    assert sorted(_row_ids(train) + _row_ids(test)) == list(range(10))
    head, tail = ds.split(0.5)
    assert _row_ids(head) == [0, 1, 2, 3, 4]
    with pytest.raises(DataError, match="fraction_train"):
        ds.split(1.5)


def test_shuffle_keeps_rows_together_and_leaves_original() -> None:
    ds = _numbered(12)
    shuffled = ds.shuffle(seed=5)
    ids = _row_ids(shuffled)
    assert sorted(ids) == list(range(12)) and ids != list(range(12))
    np.testing.assert_array_equal(shuffled.features[:, 1], shuffled.features[:, 0] * 2)
    np.testing.assert_array_equal(shuffled.label_indices(), np.array(ids) % 3)
    assert _row_ids(ds) == list(range(12))


# ------------------------------------------------------------------------------------------------
# merging
# ------------------------------------------------------------------------------------------------
def test_merge_restores_the_batched_set() -> None:
    ds = _numbered(11)
    merged = DataSet.merge(ds.batches(3))
    assert merged.equals(ds)


def test_merge_fills_missing_masks_with_ones() -> None:
    a = DataSet(np.zeros((2, 3)), np.zeros((2, 1)), labels_mask=np.array([1.0, 0.0]))
    b = DataSet(np.zeros((1, 3)), np.zeros((1, 1)))
    merged = DataSet.merge([a, b])
    np.testing.assert_array_equal(merged.labels_mask, [1.0, 0.0, 1.0])
    assert merged.features_mask is None


def test_merge_pads_sequences_of_different_lengths() -> None:
    short = DataSet(np.ones((2, 3, 4), np.float32), np.ones((2, 3, 1), np.float32))
    long = DataSet(
        np.full((1, 5, 4), 2, np.float32),
        np.ones((1, 5, 1), np.float32),
        features_mask=np.array([[1, 1, 1, 1, 0]], np.float32),
    )
    merged = DataSet.merge([short, long])
    assert merged.features.shape == (3, 5, 4)
    assert merged.labels.shape == (3, 5, 1)
    np.testing.assert_array_equal(merged.features_mask, [[1, 1, 1, 0, 0]] * 2 + [[1, 1, 1, 1, 0]])
    np.testing.assert_array_equal(merged.labels_mask, [[1, 1, 1, 0, 0]] * 2 + [[1, 1, 1, 1, 1]])
    assert np.all(merged.features[:2, 3:] == 0)


def test_merge_of_incompatible_shapes_is_a_clear_error() -> None:
    with pytest.raises(DataError, match="cannot merge"):
        DataSet.merge(
            [DataSet(np.zeros((1, 3)), np.zeros((1, 2))), DataSet(np.zeros((1, 4)), np.zeros((1, 2)))]
        )
    with pytest.raises(DataError, match="at least one"):
        DataSet.merge([])


# ------------------------------------------------------------------------------------------------
# file form
# ------------------------------------------------------------------------------------------------
def test_file_round_trip_is_exact(tmp_path: Path) -> None:
    ds = DataSet(
        np.random.default_rng(0).standard_normal((4, 6, 3)).astype(np.float32),
        np.arange(24, dtype=np.float64).reshape(4, 6, 1),
        features_mask=np.tri(4, 6, dtype=np.float32),
        labels_mask=np.tri(4, 6, 2, dtype=np.int8),
    )
    path = tmp_path / "sub" / "batch-0.psds"
    ds.save(path)
    loaded = DataSet.load(path)
    assert loaded.equals(ds)
    assert loaded.features.flags.writeable
    assert FileDataSetLoader().load(str(path)).equals(ds)
    assert DataSet.load(f"file://{path}").equals(ds)
    assert isinstance(read_data_file(path), DataSet)


def test_multidataset_round_trip_and_conversion(tmp_path: Path) -> None:
    mds = MultiDataSet(
        [np.ones((3, 2), np.float32), np.arange(12, dtype=np.int32).reshape(3, 4)],
        [np.zeros((3, 1), np.float32)],
        features_masks=[None, np.array([1, 0, 1], np.float32)],
    )
    path = tmp_path / "m.psds"
    mds.save(path)
    assert MultiDataSet.load(path).equals(mds)
    assert FileMultiDataSetLoader().load(str(path)).equals(mds)
    with pytest.raises(DataFileError, match="not a DataSet"):
        DataSet.load(path)
    single = _dataset()
    single.save(tmp_path / "s.psds")
    assert MultiDataSet.load(tmp_path / "s.psds").to_dataset().equals(single)


def test_bytes_form_round_trip() -> None:
    ds = _dataset()
    assert DataSet.from_bytes(ds.to_bytes()).equals(ds)
    assert DataSet.from_bytes(memoryview(ds.to_bytes())).equals(ds)


@pytest.mark.parametrize("cut", [0, 5, 16, 40, -1])
def test_truncated_file_raises(tmp_path: Path, cut: int) -> None:
    blob = _dataset().to_bytes()
    path = tmp_path / "t.psds"
    path.write_bytes(blob[:cut])
    with pytest.raises(DataFileError, match=r"truncated|shorter|corrupt"):
        DataSet.load(path)


def test_foreign_file_raises(tmp_path: Path) -> None:
    path = tmp_path / "foreign.npz"
    np.savez(path, x=np.zeros(3))
    with pytest.raises(DataFileError, match="not a psrv data file"):
        DataSet.load(path)


def test_flipped_payload_byte_fails_checksum() -> None:
    blob = bytearray(_dataset().to_bytes())
    blob[-3] ^= 0xFF
    with pytest.raises(DataFileError, match="checksum"):
        DataSet.from_bytes(bytes(blob))


def test_newer_version_raises() -> None:
    blob = bytearray(_dataset().to_bytes())
    struct.pack_into("<I", blob, len(DATA_FILE_MAGIC), 99)
    with pytest.raises(DataFileError, match="version 99"):
        DataSet.from_bytes(bytes(blob))


def test_missing_file_and_remote_uri_raise_data_file_error(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match="cannot read"):
        DataSet.load(tmp_path / "nope.psds")
    # an hdfs:// URI goes to the storage layer; with no HDFS reachable here it fails naming the URI
    with pytest.raises(DataFileError, match="hdfs://namenode/x.psds"):
        DataSet.load("hdfs://namenode/x.psds")


def test_psrv_nn_alone_reads_local_files_and_names_psrv_spark_for_other_uris(tmp_path: Path) -> None:
    """psrv.nn never imports psrv.spark: it reads and writes local paths itself, and for any other URI
    says that importing psrv.spark (its storage layer) is what reaches it."""
    script = f"""
import sys
import numpy as np
from psrv.nn import DataSet
from psrv.nn.errors import DataFileError
ds = DataSet(np.ones((3, 2), np.float32), np.zeros((3, 1), np.float32))
ds.save({str(tmp_path / "a.psds")!r})
assert DataSet.load("file://" + {str(tmp_path / "a.psds")!r}).equals(ds)
try:
    DataSet.load("hdfs://namenode/x.psds")
except DataFileError as exc:
    assert "import psrv.spark" in str(exc), exc
else:
    raise AssertionError("no error for an hdfs:// URI")
assert not any(name.startswith("psrv.spark") for name in sys.modules), "psrv.nn imported psrv.spark"
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_save_is_atomic_no_temp_files_left(tmp_path: Path) -> None:
    _dataset().save(tmp_path / "a.psds")
    assert [p.name for p in tmp_path.iterdir()] == ["a.psds"]


def test_loaders_satisfy_the_protocols() -> None:
    assert isinstance(FileDataSetLoader(), DataSetLoader)
    assert isinstance(FileMultiDataSetLoader(), MultiDataSetLoader)

    class Custom:
        def load(self, path: str) -> DataSet:
            return _dataset()

    assert isinstance(Custom(), DataSetLoader)


# ------------------------------------------------------------------------------------------------
# MultiDataSet operations
# ------------------------------------------------------------------------------------------------
def test_multidataset_batches_split_merge() -> None:
    n = 9
    mds = MultiDataSet(
        [np.arange(n, dtype=np.float32)[:, None], np.arange(n * 2, dtype=np.float32).reshape(n, 2)],
        [np.arange(n, dtype=np.float32)[:, None] * 10, np.ones((n, 3), np.float32)],
    )
    batches = list(mds.batches(4, shuffle=True, seed=2))
    assert [b.num_examples for b in batches] == [4, 4, 1]
    for b in batches:  # rows stay aligned across every array
        np.testing.assert_array_equal(b.labels[0][:, 0], b.features[0][:, 0] * 10)
    merged = MultiDataSet.merge(batches)
    assert sorted(merged.features[0][:, 0].tolist()) == list(range(n))
    train, test = mds.split(2 / 3)
    assert (train.num_examples, test.num_examples) == (6, 3)
    assert mds.shuffle(1).num_examples == n
    with pytest.raises(DataError, match="array counts differ"):
        MultiDataSet.merge([mds, MultiDataSet([np.zeros((1, 1))], [np.zeros((1, 1))])])


def test_multidataset_bad_shapes() -> None:
    with pytest.raises(DataError, match=r"features\[0\]=3, features\[1\]=2"):
        MultiDataSet([np.zeros((3, 1)), np.zeros((2, 1))], [np.zeros((3, 1))])
    with pytest.raises(DataError, match="expected 1 masks"):
        MultiDataSet([np.zeros((3, 1))], [np.zeros((3, 1))], features_masks=[None, None])
    with pytest.raises(DataError, match="at least one input"):
        MultiDataSet([], [np.zeros((3, 1))])


# ------------------------------------------------------------------------------------------------
# property: any numeric arrays survive the file form exactly
# ------------------------------------------------------------------------------------------------

_DTYPES = st.sampled_from([np.float32, np.float64, np.int8, np.int32, np.int64, np.uint8, np.bool_])


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(0, 6),
    feature_tail=hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
    feature_dtype=_DTYPES,
    label_dtype=_DTYPES,
    with_mask=st.booleans(),
    data=st.data(),
)
def test_file_form_round_trips_any_numeric_arrays(
    n: int, feature_tail: tuple[int, ...], feature_dtype, label_dtype, with_mask: bool, data
) -> None:
    features = data.draw(hnp.arrays(feature_dtype, (n, *feature_tail)))
    labels = data.draw(hnp.arrays(label_dtype, (n, 2)))
    mask = (
        data.draw(hnp.arrays(np.float32, (n,), elements=st.sampled_from([0.0, 1.0]))) if with_mask else None
    )
    ds = DataSet(features, labels, labels_mask=mask)
    again = DataSet.from_bytes(ds.to_bytes())
    assert again.features.dtype == ds.features.dtype and again.features.shape == ds.features.shape
    np.testing.assert_array_equal(again.features, ds.features)  # NaN compares equal here
    np.testing.assert_array_equal(again.labels, ds.labels)
    assert (again.labels_mask is None) == (mask is None)
