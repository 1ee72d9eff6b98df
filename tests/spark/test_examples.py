"""The examples in examples/ run as a user runs them: one ``spark-submit --master local-cluster[2,1,1024]``
of examples/run_examples.py runs all four in one Spark application (one start instead of four), and each
result is checked against a reference computed here from the data the example wrote: the saved LeNet
loaded here gives the accuracy the distributed evaluation reported, every real time step is counted once,
and each accuracy beats what the data's class shares give by a margin."""

from __future__ import annotations

import csv
import glob
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from spark_submit import submit

pytest.importorskip("torch")
pytest.importorskip("PIL")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NAMES = ("lenet_images", "csv_records", "sequences", "nn_vs_torch")


def test_every_example_explains_itself_with_help() -> None:
    def helps(name: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py"), "--help"], capture_output=True,
                              text=True, timeout=120)

    with ThreadPoolExecutor(len(NAMES) + 1) as pool:
        done = dict(zip((*NAMES, "run_examples"), pool.map(helps, (*NAMES, "run_examples")), strict=True))
    for name, result in done.items():
        assert result.returncode == 0, (name, result.stderr[-2000:])
        assert "usage:" in result.stdout and "spark-submit" in result.stdout, name


@pytest.mark.spark
@pytest.mark.timeout(900)
def test_the_examples_run_under_spark_submit(tmp_path) -> None:
    out = tmp_path / "results.json"
    results, stdout = submit(EXAMPLES / "run_examples.py", ["--work", str(tmp_path), "--json", str(out)], out,
                             tmp_path)
    assert set(results) == set(NAMES), stdout[-2000:]
    _check_lenet(results["lenet_images"])
    _check_csv(results["csv_records"])
    _check_sequences(results["sequences"])
    _check_nn_vs_torch(results["nn_vs_torch"])


def _majority(labels: np.ndarray) -> float:
    return float(np.bincount(labels).max() / labels.size)


def _check_lenet(result: dict) -> None:
    from psrv.nn import Network
    from psrv.spark.data import ImageDataSetLoader

    assert result["train_images"] == 480 and result["test_images"] == 256
    assert result["loaded_predicts_the_same"] and result["updater_state_saved"], result
    loaded = Network.load(result["saved"])  # the file the example saved, read by this process
    loader = ImageDataSetLoader(16, 16, channels=1, num_classes=4)
    batches = [loader.load(path) for path in result["test_batches"]]
    truth = np.concatenate([b.label_indices() for b in batches])
    predicted = np.concatenate([loaded.predict(b.features) for b in batches])
    assert truth.size == 256
    accuracy = float(np.mean(predicted == truth))
    assert accuracy == pytest.approx(result["test_accuracy"]), (accuracy, result["test_accuracy"])
    assert accuracy >= _majority(truth) + 0.4, (accuracy, _majority(truth))


def _csv_rows(path: str) -> tuple[np.ndarray, np.ndarray]:
    with open(path) as f:
        rows = np.array([[float(v) for v in r] for r in list(csv.reader(f))[1:]])
    return rows[:, :-1], rows[:, -1].astype(np.int64)


def _check_csv(result: dict) -> None:
    x_test, y_test = _csv_rows(result["test_csv"])
    x_train, y_train = _csv_rows(result["test_csv"].replace("test.csv", "train.csv"))
    # the reference: nearest class mean of the training rows, on the same test rows
    centres = np.stack([x_train[y_train == c].mean(axis=0) for c in range(3)])
    nearest = np.argmin(((x_test[:, None, :] - centres[None]) ** 2).sum(axis=2), axis=1)
    reference = float(np.mean(nearest == y_test))
    print(f"csv_records: {result['test_accuracy']:.4f}, nearest class mean {reference:.4f}")
    assert result["test_accuracy"] >= reference - 0.05, (result, reference)
    assert result["test_accuracy"] >= _majority(y_test) + 0.3, result


def _check_sequences(result: dict) -> None:
    tags = np.concatenate([np.loadtxt(p, delimiter=",", ndmin=2)[:, -1]
                           for p in sorted(glob.glob(f"{result['tagger_test']}/*.csv"))]).astype(np.int64)
    assert result["tagger_steps_evaluated"] == tags.size  # every real step once, no padding
    assert result["tagger_step_accuracy"] >= _majority(tags) + 0.4, (result, _majority(tags))
    share = result["classifier_positive_share"]
    assert result["classifier_accuracy"] >= max(share, 1 - share) + 0.3, result


def _check_nn_vs_torch(result: dict) -> None:
    assert result["outputs_differ_before_training_by"] < 1e-5, result  # the same model, the same weights
    assert result["psrv_nn_accuracy"] >= result["majority_share"] + 0.2, result
    assert abs(result["psrv_nn_accuracy"] - result["torch_accuracy"]) <= 0.05, result
