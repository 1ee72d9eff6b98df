"""psrv.spark.data on the shared real Spark session: the same pipelines as locally, on RDDs."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from psrv.nn.data import DataSet, MultiDataSet, read_data_file
from psrv.spark.data import (
    MultiDataSetSpec,
    batch_and_export,
    csv_to_records,
    list_paths,
    read_csv,
    read_exported,
    read_sequences,
    records_to_datasets,
    records_to_multidatasets,
    sequences_to_datasets,
)
from psrv.spark.data.images import ImageBatch, ImageDataSetLoader, pack_images

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]


def _by_first_feature(ds: DataSet) -> DataSet:
    return ds.subset(np.argsort(ds.features[:, 0], kind="stable"))


def test_csv_rdd_to_datasets_equals_local(spark_context, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    n = 40
    ids = np.arange(n)
    classes = rng.integers(0, 3, n)
    lines = [f"{i},{rng.standard_normal():.4f},{c}" for i, c in zip(ids, classes, strict=True)]
    (tmp_path / "d.csv").write_text("id,x,label\n" + "\n".join(lines) + "\n")
    rdd = read_csv(str(tmp_path / "d.csv"), spark_context=spark_context, min_partitions=3, skip_lines=1)
    batches = records_to_datasets(rdd, batch_size=8, label_index=2, num_classes=3).collect()
    assert all(b.num_examples <= 8 for b in batches)
    merged = _by_first_feature(DataSet.merge(batches))
    local = DataSet.merge(
        records_to_datasets(csv_to_records(lines), batch_size=8, label_index=2, num_classes=3)
    )
    assert merged.equals(local)


def test_multi_rdd_join_drops_missing_keys(spark_context) -> None:
    a = spark_context.parallelize([[k, k * 1.5] for k in range(10)], 3)
    b = spark_context.parallelize([[k, k % 3] for k in range(10) if k != 4][::-1], 2)
    spec = MultiDataSetSpec().add_input("a", 1, 2).add_output_one_hot("b", 1, 3)
    out = records_to_multidatasets(
        {"a": a, "b": b}, spec, batch_size=4, key_columns=0, drop_missing=True, ordered=True
    )
    merged = MultiDataSet.merge(out.collect())
    keys = [k for k in range(10) if k != 4]
    np.testing.assert_allclose(merged.features[0][:, 0], [k * 1.5 for k in keys])  # ordered by key
    np.testing.assert_array_equal(merged.labels[0].argmax(1), [k % 3 for k in keys])
    by_position = records_to_multidatasets(
        {"a": a, "c": a.map(lambda r: [r[0] * 2])},
        MultiDataSetSpec().add_input("a", 0, 1).add_output("c", 0, 1),
    )
    merged = MultiDataSet.merge(by_position.collect())
    np.testing.assert_array_equal(merged.labels[0], merged.features[0] * 2)


def test_sequences_from_directory_on_spark(spark_context, tmp_path: Path) -> None:
    for i, length in enumerate((2, 5, 3)):
        rows = [f"{i}.{t},{t % 2}" for t in range(length)]
        (tmp_path / f"s{i}.csv").write_text("\n".join(rows) + "\n")
    sequences = read_sequences(str(tmp_path), spark_context=spark_context)
    (batch,) = sequences_to_datasets(
        sequences.coalesce(1), batch_size=10, label_index=1, num_classes=2
    ).collect()
    assert batch.features.shape == (3, 5, 1)
    np.testing.assert_array_equal(batch.features_mask.sum(axis=1), [2, 5, 3])
    np.testing.assert_allclose(batch.features[1, :, 0], [1.0, 1.1, 1.2, 1.3, 1.4], atol=1e-6)


@pytest.mark.parametrize("through_driver", [False, True])
def test_batch_and_export_list_and_read_back(spark_context, tmp_path: Path, through_driver: bool) -> None:
    n = 30
    data = DataSet.from_class_indices(np.arange(n, dtype=np.float32)[:, None], np.arange(n) % 2, 2)
    rdd = spark_context.parallelize(list(data.batches(5)), 3)
    target = f"file://{tmp_path}/export" if through_driver else str(tmp_path / "export")
    paths = batch_and_export(rdd, 4, target, through_driver=through_driver)
    # each of 3 partitions holds 10 examples -> batches of 4, 4, 2
    assert len(paths) == 9 and paths == sorted(paths)
    listed = list_paths(spark_context, target)
    assert listed == paths
    assert all(p.startswith("file:///") if through_driver else os.path.isabs(p) for p in paths)
    local = [read_data_file(p) for p in list_paths(None, str(tmp_path / "export"))]
    assert sorted(b.num_examples for b in local) == [2, 2, 2, 4, 4, 4, 4, 4, 4]
    assert _by_first_feature(DataSet.merge(local)).equals(data)
    back = read_exported(spark_context, target).collect()
    assert _by_first_feature(DataSet.merge(back)).equals(data)


@pytest.mark.parametrize("through_driver", [False, True])
def test_pack_images_with_spark(spark_context, tmp_path: Path, through_driver: bool) -> None:
    levels = {"dark": 20, "light": 230}
    for name, level in levels.items():
        (tmp_path / "src" / name).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(np.full((6, 6), level, np.uint8)).save(tmp_path / "src" / name / f"{i}.png")
    packed = pack_images(
        str(tmp_path / "src"),
        str(tmp_path / "out"),
        batch_size=2,
        spark_context=spark_context,
        min_partitions=2,
    )
    assert packed.class_names == ["dark", "light"] and packed.num_images == 6
    loader = ImageDataSetLoader(3, 3, channels=1)
    total = 0
    for path in packed.paths:
        ds = loader.load(path)
        total += ds.num_examples
        expected = np.array([levels[packed.class_names[c]] for c in ds.label_indices()]) / 255.0
        np.testing.assert_allclose(ds.features.reshape(ds.num_examples, -1).mean(axis=1), expected, atol=1e-6)
        assert ImageBatch.load(path).class_names == ["dark", "light"]
    assert total == 6
