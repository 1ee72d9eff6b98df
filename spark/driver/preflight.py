"""Checks on the driver before a training job: one clear line instead of a failed or empty job.

What can be told from metadata (DataFrame columns, the loader, the user's code) is checked without
Spark; what needs the data (how many examples each worker gets, whether a sample fits the network)
is learned in one light pass that only counts examples and keeps two rows (no training, no export).

Batch larger than the data: psrv *refuses* (a ``SparkConfigError`` naming the numbers and the fix)
rather than clamping silently, because a clamped batch changes the optimisation the user asked for.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from psrv.nn.data import MultiDataSet
from psrv.nn.protocol import MultiIONetwork, TrainableNetwork, is_multi_io
from psrv.nn.torch_shapes import labels_fit, shape_fits
from psrv.spark.errors import SparkConfigError, SparkInputError
from psrv.spark.task.environment import describe_python, environment_probe
from psrv.spark.task.profile import profile_partition

if TYPE_CHECKING:
    from pyspark import RDD, SparkContext

_CHECKED_APPLICATIONS: set[str] = set()  # Spark applications whose executors passed the environment check


def check_columns(columns: Sequence[str], features_col: str, label_col: str) -> None:
    """Both columns exist (``features_col`` / ``label_col`` named when one does not)."""
    for option, name in (("features_col", features_col), ("label_col", label_col)):
        if name not in columns:
            raise SparkInputError(
                f"DataFrame has no column {name!r} ({option}={name!r}); its columns are {list(columns)}: "
                f"pass SparkNetwork(..., {option}='<column>')"
            )


@dataclass
class DataProfile:
    """Example counts of each element of each partition, and a sample of the first rows."""

    element_sizes: list[list[int]]
    sample: Any | None  # a DataSet of up to SAMPLE_ROWS examples
    non_finite: list[Any] = field(default_factory=list)  # per partition: its first NaN/inf, or None

    def element_counts(self) -> list[int]:
        """Elements (DataSets) per partition: lets the balanced repartitioning skip its counting job."""
        return [len(sizes) for sizes in self.element_sizes]

    @property
    def total(self) -> int:
        return sum(sum(sizes) for sizes in self.element_sizes)

    def shares(self, workers: int, repartitioned: bool) -> list[int]:
        """Examples per worker after the training master's repartitioning (balanced round-robin by
        element, as psrv.spark.driver.partitioning deals them) or as the partitions are."""
        if not repartitioned:
            return [sum(sizes) for sizes in self.element_sizes]
        shares = [0] * workers
        index = 0
        for sizes in self.element_sizes:
            for size in sizes:
                shares[index % workers] += size
                index += 1
        return shares


def profile(rdd: RDD) -> DataProfile:
    """One light pass over an RDD of DataSets: element sizes per partition and a sample."""
    parts = rdd.mapPartitions(profile_partition).collect()
    sample = next((s for _, s, _ in parts if s is not None), None)
    return DataProfile([sizes for sizes, _, _ in parts], sample, [bad for _, _, bad in parts])


def check_finite_data(data: DataProfile) -> None:
    """Refuse data holding NaN/inf before training, naming the partition, the row and the column."""
    for partition, found in enumerate(data.non_finite):
        if found is not None:
            row, what, index, value = found
            raise SparkInputError(
                f"the data holds a non-finite value ({value}) in the {what} of row {row} of partition "
                f"{partition} (index {list(index)} within the row): training would turn the network into "
                "NaN; remove or impute NaN/inf first (e.g. DataFrame.na.drop() or na.fill())")


def check_batch_fits(batch_size: int, data: DataProfile, workers: int, repartitioned: bool) -> None:
    """Refuse a minibatch larger than what every worker gets (it would train nothing useful)."""
    if data.total == 0:
        raise SparkInputError("fit: the data holds no example (empty RDD or DataFrame)")
    shares = data.shares(workers, repartitioned)
    largest = max(shares)
    if batch_size > largest:
        raise SparkConfigError(
            f"batch_size_per_worker={batch_size} is larger than the data of every worker ({data.total} "
            f"examples over {len(shares)} workers, at most {largest} each): each would take one short "
            f"minibatch per epoch; use batch_size_per_worker <= {largest} or fewer workers"
        )


def _per_example_shape(array: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in np.shape(array)[1:])


def check_sample(network: TrainableNetwork, sample: Any, label_col: str | None = None) -> None:
    """The sample's features and labels fit the network (``input_shape`` named when they do not)."""
    if sample is None:
        return
    if isinstance(sample, MultiDataSet) or is_multi_io(network):
        check_multi_sample(network, sample)
        return
    input_shape = tuple(network.input_shape or ())
    features = _per_example_shape(sample.features)
    if input_shape and not _features_fit(features, input_shape):
        raise SparkInputError(
            f"the data's features have shape {features} per example ({int(np.prod(features))} values) but "
            f"the network's input_shape is {input_shape} ({int(np.prod(input_shape))} values): build the "
            f"network with input_shape={features} or reshape the features"
        )
    try:
        network.output(sample.features)
    except Exception as exc:  # noqa: BLE001 - whatever the user's module raises, named with input_shape
        first = (str(exc).strip().splitlines() or [repr(exc)])[0][:300]
        raise SparkInputError(
            f"the network cannot run on a sample of the data (features of shape {features} per example, "
            f"network input_shape={input_shape}): {type(exc).__name__}: {first}; check input_shape against "
            "the data and the module's first layer"
        ) from exc
    outputs = network.num_outputs
    labels = _per_example_shape(sample.labels)
    shaped = _output_shape(network, 0)
    if shaped is not None:
        if not labels_fit(shaped, labels, None in input_shape):
            raise SparkInputError(
                f"the data's labels have shape {labels} per example but the network outputs "
                f"{_batch_shape(shaped, None in input_shape)}: expected labels of that shape, or class "
                "indices without its class axis")
    elif outputs is not None and labels and int(np.prod(labels)) != int(outputs):
        where = f" (label_col={label_col!r})" if label_col else ""
        raise SparkInputError(
            f"the data's labels have shape {labels} per example{where} but the network has {outputs} "
            f"outputs: expected one-hot rows of {outputs} (or class indices in [0, {outputs}) in a DataFrame)"
        )


def _features_fit(features: tuple[int, ...], input_shape: tuple[Any, ...]) -> bool:
    """The same shape (None: any length there), or as many values (flat rows of an image)."""
    if None in input_shape:
        return shape_fits(features, input_shape)
    return features == input_shape or int(np.prod(features)) == int(np.prod(input_shape))


def _batch_shape(shape: tuple[int, ...], varying: bool) -> str:
    """An output's shape as (n, ...); a sequence output's steps are T when the input's length varies."""
    dims = ["T", str(shape[1])] if varying and len(shape) == 2 else list(map(str, shape))
    return "(" + ", ".join(["n", *dims]) + ")"


def _output_shape(network: Any, index: int) -> tuple[int, ...] | None:
    """An output's per-example shape when it is not (k,) rows (a TorchNetwork's (n,), (n, T, k) ...)."""
    shapes = getattr(getattr(network, "layout", None), "output_shapes", None)
    if not shapes or len(shapes[index]) == 1:
        return None
    return tuple(shapes[index])


def check_multi_sample(network: TrainableNetwork, sample: Any) -> None:
    """A sample of MultiDataSets (or DataSets) against a network of several inputs/outputs: as many
    feature and label arrays as the module takes and gives, each of the right shape, and one forward pass."""
    features = sample.features if isinstance(sample.features, list) else [sample.features]
    labels = sample.labels if isinstance(sample.labels, list) else [sample.labels]
    several = isinstance(network, MultiIONetwork)
    shapes = tuple(network.input_shape or ())
    if not (several and network.multi_input):
        shapes = (shapes,)
    sizes = tuple(network.output_sizes) if several else (network.num_outputs,)
    if len(features) != len(shapes) or len(labels) != len(sizes):
        kind = type(network).__name__
        hint = (" (psrv.nn.Network is sequential: one input, one output; use psrv.nn.TorchNetwork with an "
                "nn.Module whose forward takes one tensor per input and returns a tuple)"
                if kind == "Network" else "; input_shape takes one shape per input, e.g. [(8,), (4,)]")
        raise SparkInputError(
            f"the data has {len(features)} feature and {len(labels)} label arrays per minibatch, but the "
            f"network ({kind}) takes {len(shapes)} input(s) and gives {len(sizes)} output(s){hint}")
    for i, (array, shape) in enumerate(zip(features, shapes, strict=True)):
        got = _per_example_shape(array)
        if not _features_fit(got, tuple(shape)):
            raise SparkInputError(f"the data's features[{i}] have shape {got} per example but the network's "
                                  f"input_shape[{i}] is {tuple(shape)}: fix input_shape or the data")
    for i, (array, size) in enumerate(zip(labels, sizes, strict=True)):
        got = _per_example_shape(array)
        shaped = _output_shape(network, i)
        varying = any(None in tuple(s) for s in shapes)
        if shaped is not None:
            if not labels_fit(shaped, got, varying):
                raise SparkInputError(f"the data's labels[{i}] have shape {got} per example but output {i} "
                                      f"of the network is {_batch_shape(shaped, varying)}")
        elif size is not None and got and int(np.prod(got)) != int(size):
            raise SparkInputError(f"the data's labels[{i}] have shape {got} per example but output {i} of "
                                  f"the network has {size} columns")
    try:
        network.output(features if len(features) > 1 else features[0])
    except Exception as exc:  # noqa: BLE001 - whatever the user's module raises, named with input_shape
        first = (str(exc).strip().splitlines() or [repr(exc)])[0][:300]
        raise SparkInputError(
            f"the network cannot run on a sample of the data (network input_shape={shapes}): "
            f"{type(exc).__name__}: {first}; check input_shape against the data and the module") from exc


def _python_line(found: dict[str, Any]) -> str:
    return f"Python {found.get('python')} at {found.get('executable')}"


def environment_differences(driver: dict[str, Any], executor: dict[str, Any]) -> list[str]:
    """What the executor's interpreter lacks or runs in another version than the driver's."""
    differences = []
    if executor.get("psrv") is None:
        differences.append(f"psrv cannot be imported there ({executor.get('psrv_error')})")
    elif executor["psrv"] != driver.get("psrv"):
        differences.append(f"psrv {executor['psrv']} there, {driver.get('psrv')} on the driver")
    if str(executor.get("python", "")).split(".")[:2] != str(driver.get("python", "")).split(".")[:2]:
        differences.append(f"Python {executor.get('python')} there, {driver.get('python')} on the driver")
    if driver.get("torch") is not None and executor.get("torch") != driver["torch"]:
        there = executor.get("torch") or f"none ({executor.get('torch_error')})"
        differences.append(f"torch {there} there, {driver['torch']} on the driver")
    return differences


def _environment_fix(driver: dict[str, Any]) -> str:
    return (f"point the executors at the driver's environment: export PYSPARK_PYTHON={driver['executable']} "
            "before starting Python or spark-submit (or set spark.pyspark.python), or on a cluster ship the "
            "packed environment (README, Running on a cluster: venv-pack, --archives ...#environment, "
            "spark.pyspark.python=./environment/bin/python)")


def check_environment(spark_context: SparkContext) -> None:
    """Before the first job of an application: its executors import psrv and run the same psrv, Python
    and torch as the driver (a one-task job; psrv-free, so it runs whatever the executors have).
    Refused with which Python they run, what differs and how to point them at the driver's
    environment, instead of a ``ModuleNotFoundError`` deep in a failed training job."""
    application = str(spark_context.applicationId)
    if application in _CHECKED_APPLICATIONS:
        return
    modules = ("psrv", "torch") if "torch" in sys.modules else ("psrv",)  # torch: where the driver uses it
    driver = describe_python(modules)
    try:
        found = spark_context.parallelize([0], 1).mapPartitions(environment_probe(modules)).collect()
    except Exception as exc:  # noqa: BLE001 - an executor that cannot even run the probe
        first = (str(exc).strip().splitlines() or [repr(exc)])[0][:300]
        raise SparkConfigError(f"the Spark executors could not run a Python task ({first}); "
                               f"{_environment_fix(driver)}") from exc
    executor = found[0] if found else driver
    differences = environment_differences(driver, executor)
    if differences:
        raise SparkConfigError(
            f"the Spark executors run {_python_line(executor)} and the driver {_python_line(driver)}: "
            f"{'; '.join(differences)}. To fix it, {_environment_fix(driver)}")
    _CHECKED_APPLICATIONS.add(application)


__all__ = ["DataProfile", "check_batch_fits", "check_columns", "check_environment", "check_finite_data",
           "check_multi_sample", "check_sample", "environment_differences", "profile"]
