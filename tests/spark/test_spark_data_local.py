"""psrv.spark.data pipelines on one machine (no Spark): each round-trips a small generated data set."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from psrv.nn.data import DataSet, MultiDataSet, read_data_file
from psrv.nn.errors import DataFileError
from psrv.spark.data import (
    MultiDataSetSpec,
    batch_and_export,
    csv_to_records,
    export_datasets,
    list_paths,
    parse_csv_line,
    read_csv,
    read_sequences,
    rebatch,
    records_to_datasets,
    records_to_multidatasets,
    sequences_to_datasets,
)
from psrv.spark.data.images import ImageBatch, ImageDataSetLoader, label_of, pack_images
from psrv.spark.errors import SparkConfigError, SparkInputError


def _table(n: int = 7, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    features = np.round(rng.standard_normal((n, 3)), 3)
    classes = rng.integers(0, 4, n)
    return features, classes


def _csv_lines(features: np.ndarray, classes: np.ndarray) -> list[str]:
    return [",".join([*(f"{v:.3f}" for v in row), str(c)]) for row, c in zip(features, classes, strict=True)]


# ------------------------------------------------------------------------------------------------
# CSV and records
# ------------------------------------------------------------------------------------------------
def test_parse_csv_line_numbers_strings_and_quotes() -> None:
    assert parse_csv_line('1, 2.5,cat,"a,b",-3e2') == [1.0, 2.5, "cat", "a,b", -300.0]
    assert parse_csv_line("1;2", delimiter=";") == [1.0, 2.0]


def test_csv_classification_round_trip(tmp_path: Path) -> None:
    features, classes = _table()
    path = tmp_path / "data.csv"
    path.write_text("x0,x1,x2,label\n" + "\n".join(_csv_lines(features, classes)) + "\n# comment\n\n")
    records = read_csv(str(path), skip_lines=1, comment="#")
    assert len(records) == 7
    batches = records_to_datasets(records, batch_size=3, label_index=3, num_classes=4)
    assert [b.num_examples for b in batches] == [3, 3, 1]
    merged = DataSet.merge(batches)
    np.testing.assert_allclose(merged.features, features, atol=1e-6)
    assert merged.labels.dtype == np.float32 and merged.labels.shape == (7, 4)
    np.testing.assert_array_equal(merged.label_indices(), classes)


def test_csv_label_first_column_negative_index_and_class_names() -> None:
    records = csv_to_records(["cat,1,2", "dog,3,4", "cat,5,6"])
    ds = records_to_datasets(records, label_index=0, class_names=["cat", "dog"])[0]
    np.testing.assert_array_equal(ds.features, [[1, 2], [3, 4], [5, 6]])
    np.testing.assert_array_equal(ds.label_indices(), [0, 1, 0])
    last = records_to_datasets(csv_to_records(["1,2,1", "3,4,0"]), label_index=-1, num_classes=2)[0]
    np.testing.assert_array_equal(last.label_indices(), [1, 0])


def test_regression_label_range() -> None:
    records = csv_to_records(["1,2,10,20", "3,4,30,40"])
    ds = records_to_datasets(records, label_range=(2, 4))[0]
    np.testing.assert_array_equal(ds.features, [[1, 2], [3, 4]])
    np.testing.assert_array_equal(ds.labels, [[10, 20], [30, 40]])


def test_record_errors_name_record_and_column() -> None:
    with pytest.raises(
        SparkInputError, match=r"record 1, column 3: expected a class index in \[0, 4\), got 9"
    ):
        records_to_datasets(csv_to_records(["1,2,3,0", "1,2,3,9"]), label_index=3, num_classes=4)
    with pytest.raises(SparkInputError, match=r"record 0, column 1: expected a number, got 'x'"):
        records_to_datasets(csv_to_records(["1,x,0"]), label_index=2, num_classes=2)
    with pytest.raises(SparkInputError, match="record 1: expected 3 columns"):
        records_to_datasets(csv_to_records(["1,2,0", "1,0"]), label_index=-1, num_classes=2)
    with pytest.raises(SparkConfigError, match="exactly one of"):
        records_to_datasets([], label_index=0, label_range=(0, 1))
    with pytest.raises(SparkConfigError, match="num_classes"):
        records_to_datasets([], label_index=0)
    with pytest.raises(SparkInputError, match="unknown class label 'emu'"):
        records_to_datasets(csv_to_records(["emu,1"]), label_index=0, class_names=["cat"])


# ------------------------------------------------------------------------------------------------
# MultiDataSets
# ------------------------------------------------------------------------------------------------
def _sources() -> dict[str, list[list[float]]]:
    # key in column 0; "a" has keys 1..5, "b" lacks key 3 and lists its rows in another order
    a = [[k, k * 10.0, k * 100.0] for k in (1, 2, 3, 4, 5)]
    b = [[k, k % 2] for k in (5, 4, 2, 1)]
    return {"a": a, "b": b}


def _spec() -> MultiDataSetSpec:
    return MultiDataSetSpec().add_input("a", 1, 3).add_input("a", 0, 1).add_output_one_hot("b", 1, 2)


def test_multidatasets_joined_on_key_drop_missing() -> None:
    out = records_to_multidatasets(_sources(), _spec(), batch_size=3, key_columns=0, drop_missing=True)
    assert [m.num_examples for m in out] == [3, 1]
    merged = MultiDataSet.merge(out)
    keys = [1, 2, 4, 5]
    np.testing.assert_array_equal(merged.features[0], [[k * 10, k * 100] for k in keys])
    np.testing.assert_array_equal(merged.features[1], [[k] for k in keys])
    np.testing.assert_array_equal(merged.labels[0], np.eye(2)[[k % 2 for k in keys]])


def test_multidatasets_missing_key_raises_without_drop() -> None:
    with pytest.raises(SparkInputError, match=r"key 3(\.0)? is missing from source\(s\) \['b'\]"):
        records_to_multidatasets(_sources(), _spec(), key_columns=0)


def test_multidatasets_by_position_and_bad_spec() -> None:
    sources = {"x": [[1, 2], [3, 4]], "y": [[0], [1]]}
    spec = MultiDataSetSpec().add_input("x", 0, 2).add_output("y", 0, 1)
    (only,) = records_to_multidatasets(sources, spec)
    np.testing.assert_array_equal(only.features[0], [[1, 2], [3, 4]])
    np.testing.assert_array_equal(only.labels[0], [[0], [1]])
    with pytest.raises(SparkConfigError, match=r"source\(s\) \['z'\]"):
        records_to_multidatasets(sources, MultiDataSetSpec().add_input("z", 0, 1))
    with pytest.raises(SparkInputError, match="equal length"):
        records_to_multidatasets({"x": [[1]], "y": [[1], [2]]}, MultiDataSetSpec().add_input("x", 0, 1))
    with pytest.raises(SparkInputError, match="more than once"):
        records_to_multidatasets({"x": [[1], [1]]}, MultiDataSetSpec().add_input("x", 0, 1), key_columns=0)


# ------------------------------------------------------------------------------------------------
# sequences
# ------------------------------------------------------------------------------------------------
def _write_sequences(directory: Path) -> list[np.ndarray]:
    """Three sequences of lengths 3, 1, 4: columns f0, f1, class; returns each as an array."""
    rng = np.random.default_rng(4)
    sequences = []
    for i, length in enumerate((3, 1, 4)):
        values = np.column_stack([np.round(rng.standard_normal((length, 2)), 3), rng.integers(0, 3, length)])
        (directory / f"seq_{i}.csv").write_text("\n".join(",".join(f"{v:g}" for v in row) for row in values))
        sequences.append(values)
    return sequences


def test_sequences_padded_with_masks(tmp_path: Path) -> None:
    expected = _write_sequences(tmp_path)
    sequences = read_sequences(str(tmp_path))
    assert [os.path.basename(p) for p, _ in sequences] == ["seq_0.csv", "seq_1.csv", "seq_2.csv"]
    (batch,) = sequences_to_datasets(sequences, batch_size=8, label_index=2, num_classes=3)
    assert batch.features.shape == (3, 4, 2) and batch.labels.shape == (3, 4, 3)
    np.testing.assert_array_equal(batch.features_mask, [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    np.testing.assert_array_equal(batch.labels_mask, batch.features_mask)
    for i, seq in enumerate(expected):
        np.testing.assert_allclose(batch.features[i, : len(seq)], seq[:, :2], atol=1e-6)
        np.testing.assert_array_equal(batch.labels[i, : len(seq)].argmax(-1), seq[:, 2])
        assert np.all(batch.features[i, len(seq) :] == 0)


def test_sequence_errors_name_the_file(tmp_path: Path) -> None:
    (tmp_path / "good.csv").write_text("1,2,0\n")
    (tmp_path / "empty.csv").write_text("\n")
    with pytest.raises(SparkInputError, match="empty.csv: empty"):
        sequences_to_datasets(read_sequences(str(tmp_path)), label_index=2, num_classes=2)
    (tmp_path / "empty.csv").write_text("1,2,7\n")
    with pytest.raises(SparkInputError, match=r"empty\.csv: record 0, column 2"):
        sequences_to_datasets(read_sequences(str(tmp_path)), label_index=2, num_classes=2)


# ------------------------------------------------------------------------------------------------
# export, rebatch, listing
# ------------------------------------------------------------------------------------------------
def test_rebatch_exact_sizes_preserve_order() -> None:
    parts = [
        DataSet(np.arange(a, b, dtype=np.float32)[:, None], np.zeros((b - a, 1)))
        for a, b in [(0, 5), (5, 6), (6, 20), (20, 23)]
    ]
    batches = list(rebatch(parts, 4))
    assert [b.num_examples for b in batches] == [4, 4, 4, 4, 4, 3]
    np.testing.assert_array_equal(np.concatenate([b.features[:, 0] for b in batches]), np.arange(23))


def test_export_datasets_and_list_paths(tmp_path: Path) -> None:
    features, classes = _table(10)
    ds = DataSet.from_class_indices(features.astype(np.float32), classes, 4)
    paths = export_datasets([ds], str(tmp_path / "out"), batch_size=4)
    assert [os.path.basename(p) for p in paths] == [f"batch-00000{i}.psds" for i in range(3)]
    (tmp_path / "out" / "_SUCCESS").write_text("")
    (tmp_path / "out" / ".hidden").write_text("")
    assert list_paths(None, str(tmp_path / "out")) == paths
    assert DataSet.merge(read_data_file(p) for p in paths).equals(ds)
    with pytest.raises(SparkInputError, match="not a directory"):
        list_paths(None, str(tmp_path / "missing"))


def test_batch_and_export_of_a_plain_iterable(tmp_path: Path) -> None:
    """Like every pipeline, batch_and_export takes a plain iterable too: one partition, written here."""
    features, classes = _table(10)
    ds = DataSet.from_class_indices(features.astype(np.float32), classes, 4)
    pieces = iter([ds.subset(slice(0, 3)), ds.subset(slice(3, 10))])
    paths = batch_and_export(pieces, 4, str(tmp_path / "exported"))
    assert [os.path.basename(p) for p in paths] == [f"part-00000-00000{i}.psds" for i in range(3)]
    assert [read_data_file(p).num_examples for p in paths] == [4, 4, 2]
    assert DataSet.merge(read_data_file(p) for p in paths).equals(ds)


# ------------------------------------------------------------------------------------------------
# images
# ------------------------------------------------------------------------------------------------
def _write_images(root: Path, by_folder: bool = True) -> dict[str, int]:
    """Images of 3 classes with a class-specific grey level; returns file name -> class index."""
    classes = {"ant": 30, "bee": 120, "cow": 240}
    expected = {}
    for c_index, (name, level) in enumerate(classes.items()):
        folder = root / name if by_folder else root
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(2 + c_index):
            file_name = f"{name}_{i}.{'jpg' if i % 2 else 'png'}"
            pixels = np.full((10, 7, 3), level, np.uint8)
            Image.fromarray(pixels).save(folder / file_name, quality=95)
            expected[file_name] = c_index
    return expected


def test_pack_images_from_class_folders_and_load(tmp_path: Path) -> None:
    expected = _write_images(tmp_path / "src")
    (tmp_path / "src" / "README.txt").write_text("not an image")
    packed = pack_images(str(tmp_path / "src"), str(tmp_path / "out"), batch_size=4)
    assert packed.class_names == ["ant", "bee", "cow"]
    assert packed.num_images == 9 and len(packed.paths) == 3
    loader = ImageDataSetLoader(5, 4, channels=3)
    seen = {}
    for path in packed.paths:
        batch = ImageBatch.load(path)
        ds = loader.load(path)
        assert ds.features.shape == (batch.num_examples, 3, 5, 4) and ds.features.dtype == np.float32
        for name, label, pixels in zip(batch.names, ds.label_indices(), ds.features, strict=True):
            seen[name] = int(label)
            level = {0: 30, 1: 120, 2: 240}[int(label)] / 255.0
            np.testing.assert_allclose(pixels, level, atol=3 / 255)  # JPEG is lossy, slightly
    assert seen == expected


def test_pack_images_labels_from_file_names_grey_channels_last(tmp_path: Path) -> None:
    expected = _write_images(tmp_path / "flat", by_folder=False)
    packed = pack_images(
        str(tmp_path / "flat"), str(tmp_path / "out"), batch_size=100, label_pattern=r"^(?P<label>[a-z]+)_\d+"
    )
    assert packed.class_names == ["ant", "bee", "cow"]
    (path,) = packed.paths
    ds = ImageDataSetLoader(10, 7, channels=1, channels_first=False, scale=False).load(path)
    assert ds.features.shape == (9, 10, 7, 1)
    assert ds.features.max() > 200  # unscaled
    batch = ImageBatch.load(path)
    assert dict(zip(batch.names, ds.label_indices().tolist(), strict=True)) == expected


def test_image_errors(tmp_path: Path) -> None:
    _write_images(tmp_path / "src")
    with pytest.raises(SparkInputError, match="'cow' is not among the class names"):
        pack_images(str(tmp_path / "src"), str(tmp_path / "out"), class_names=["ant", "bee"])
    with pytest.raises(SparkInputError, match="does not match the label pattern"):
        label_of("/x/ant.png", r"^\d+")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.psimg").write_bytes(b"garbage that is long enough to be read")
    with pytest.raises(DataFileError, match="not a psrv data file"):
        ImageDataSetLoader(4, 4).load(str(tmp_path / "bad" / "x.psimg"))
    ds = DataSet(np.zeros((1, 1)), np.zeros((1, 1)))
    ds.save(tmp_path / "bad" / "d.psds")
    with pytest.raises(DataFileError, match="expected an ImageBatch"):
        ImageBatch.load(str(tmp_path / "bad" / "d.psds"))
    broken = ImageBatch([b"\x89PNG\r\n\x1a\nnot really"], np.array([0]), ["a"], ["broken.png"])
    with pytest.raises(DataFileError, match="broken.png: cannot decode image"):
        ImageDataSetLoader(4, 4).decode(broken)
