"""Shipping the user's code to the executors, as PySpark does, and refusing on the driver what cannot go.

Classes and functions defined in ``__main__`` or a notebook (an ``nn.Module``, a loss, an optimizer,
a loader) travel by value (cloudpickle, the copy PySpark vendors, so ``register_pickle_by_value`` made
for PySpark counts here too); everything else travels by reference and must be importable where the
executors run. Whether it is cannot be asked of the executors before a job, so the driver applies the
rule that catches the usual mistake: a module found only through the driver's script directory (or
current directory) and not shipped with ``sc.addPyFile`` / ``--py-files`` / ``PYTHONPATH`` is refused,
naming the object and the fix, before any Spark job starts.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import types
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import msgpack
from psrv.encoding.strategies import POST_PROCESSOR_MEMBERS, THRESHOLD_ALGORITHM_MEMBERS, missing_members
from psrv.nn.protocol import TrainableNetwork
from psrv.nn.torch_adapter import TorchNetwork
from psrv.spark.errors import SparkConfigError

if TYPE_CHECKING:
    from pyspark import SparkContext


def _cloudpickle() -> Any:
    from pyspark import cloudpickle

    return cloudpickle


@dataclass(frozen=True)
class ByReference:
    """A class or function pickled by reference: the executors import ``module`` to find it."""

    module: str
    qualname: str


class _Sink:
    """A file that keeps nothing: a check pickles without holding a copy of large parameters."""

    def write(self, data: Any) -> int:
        return len(memoryview(data))


def recording_pickle_module() -> tuple[Any, list[ByReference]]:
    """A pickle module (for ``torch.save(pickle_module=...)``) that pickles like cloudpickle and records
    every class and function it pickles by reference."""
    cloudpickle = _cloudpickle()
    seen: list[ByReference] = []
    by_reference = cloudpickle.cloudpickle._should_pickle_by_reference

    class RecordingPickler(cloudpickle.Pickler):
        def reducer_override(self, obj: Any) -> Any:
            if isinstance(obj, type | types.FunctionType):
                try:
                    if by_reference(obj):
                        seen.append(ByReference(str(getattr(obj, "__module__", "?")),
                                                str(getattr(obj, "__qualname__", obj))))
                except Exception:  # noqa: BLE001 - recording must never change how pickling behaves
                    pass
            return super().reducer_override(obj)

    module = types.SimpleNamespace(Pickler=RecordingPickler, Unpickler=__import__("pickle").Unpickler,
                                   __name__="psrv.spark.driver.shipping.recording")
    return module, seen


def dumps_by_value(obj: Any) -> bytes:
    """``obj`` pickled the way PySpark ships closures (``__main__`` code by value)."""
    return _cloudpickle().dumps(obj)


def pickled_references(obj: Any, what: str, fix: str = "") -> list[ByReference]:
    """Pickle ``obj`` into nothing; return what it refers to by reference, or say on the driver why it
    cannot be pickled at all."""
    module, seen = recording_pickle_module()
    try:
        module.Pickler(_Sink(), protocol=_pickle_protocol()).dump(obj)
    except Exception as exc:  # noqa: BLE001 - any pickling failure is the user's object's
        raise SparkConfigError(
            f"{what}: a {type(obj).__name__} cannot be shipped to the executors, it cannot be pickled "
            f"({type(exc).__name__}: {_short(exc)}); {fix or 'hold no open files, locks or sockets in it'}"
        ) from exc
    return seen


def _pickle_protocol() -> int:
    import pickle

    return pickle.HIGHEST_PROTOCOL


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else repr(exc))[:300]


# -- where the executors can import from ------------------------------------------------------------------

def _installed_roots() -> list[str]:
    """Folders holding the interpreter's own and installed packages (the same on every executor of a
    packed environment or a provisioned cluster)."""
    roots = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(os.path.realpath(path))
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        roots.add(os.path.realpath(os.path.join(prefix, "lib")))
    try:
        import site

        roots.update(os.path.realpath(p) for p in site.getsitepackages())
        roots.add(os.path.realpath(site.getusersitepackages()))
    except Exception:  # noqa: BLE001 - a virtualenv without site helpers
        pass
    return sorted(roots)


def _driver_only_paths() -> set[str]:
    """sys.path entries that exist only for the driver: the script's folder, the current directory."""
    paths = {os.path.realpath(os.getcwd())}
    main = sys.modules.get("__main__")
    main_file = getattr(main, "__file__", None)
    if main_file:
        paths.add(os.path.realpath(os.path.dirname(os.path.abspath(main_file))))
    if sys.path and sys.path[0] in ("", "."):
        paths.add(os.path.realpath(os.getcwd()))
    return paths


def _shipped_files(spark_context: SparkContext | None) -> list[str]:
    """The files PySpark puts on the executors' path (``addPyFile``, ``--py-files``, ``PYTHONPATH``)."""
    files: list[str] = []
    if spark_context is not None:
        files.extend(getattr(spark_context, "_python_includes", None) or [])
        try:  # every file added with addFile / addPyFile / --py-files (the executors' SparkFiles root)
            added = list(spark_context.listFiles)
        except Exception:  # noqa: BLE001 - older Spark or a stopped context: the other sources remain
            added = []
        for uri in added:
            parsed = urlparse(str(uri))
            files.append(parsed.path if parsed.scheme in ("", "file") else str(uri))
        conf = spark_context.getConf()
        for key in ("spark.submit.pyFiles", "spark.executorEnv.PYTHONPATH"):
            value = conf.get(key, "") or ""
            files.extend(p for p in value.replace(os.pathsep, ",").split(",") if p)
    files.extend(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)
    return files


def _top_level_names(entry: str) -> set[str] | None:
    """Top-level module names a path entry provides; None when it cannot be told (ship it: trust it)."""
    name = os.path.basename(entry.rstrip("/"))
    if name.endswith(".py"):
        return {name[:-3]}
    if name.endswith((".zip", ".egg", ".whl")):
        if not os.path.isfile(entry):
            return None  # only the file name is known here (addPyFile keeps basenames)
        try:
            with zipfile.ZipFile(entry) as archive:
                tops = {n.split("/")[0] for n in archive.namelist()}
        except (OSError, zipfile.BadZipFile):
            return None
        return {t[:-3] if t.endswith(".py") else t for t in tops}
    if os.path.isdir(entry):
        try:
            return {n[:-3] if n.endswith(".py") else n for n in os.listdir(entry)}
        except OSError:
            return None
    return set()


def _module_root(module: types.ModuleType, top: str) -> str | None:
    """The sys.path entry a top-level module was found under."""
    location = getattr(module, "__file__", None)
    if location:
        folder = os.path.dirname(os.path.abspath(location))
        if os.path.basename(location).startswith("__init__."):
            folder = os.path.dirname(folder)
        return os.path.realpath(folder)
    paths = list(getattr(module, "__path__", []) or [])
    return os.path.realpath(os.path.dirname(paths[0])) if paths else None


def unshippable_module(top: str, spark_context: SparkContext | None) -> str | None:
    """The file of top-level module ``top`` when the executors cannot import it, else None."""
    if top in sys.builtin_module_names or top in getattr(sys, "stdlib_module_names", ()) \
            or top in ("__main__", "psrv", "pyspark", "py4j"):
        return None
    module = sys.modules.get(top)
    if module is None:
        return None  # not imported here: nothing to judge by
    root = _module_root(module, top)
    if root is None:
        return None
    if any(root == r or root.startswith(r + os.sep) for r in _installed_roots()):
        return None
    for entry in _shipped_files(spark_context):
        names = _top_level_names(entry)
        if names is None or top in names:
            return None
    if root not in _driver_only_paths():
        return None  # found through a path the executors' interpreter shares (.pth, PYTHONPATH)
    return getattr(module, "__file__", None) or root


def check_references(references: Iterable[ByReference], what: str,
                     spark_context: SparkContext | None) -> None:
    """Refuse, on the driver, a reference the executors cannot import (naming the object and the fix)."""
    for reference in references:
        top = reference.module.split(".")[0]
        location = unshippable_module(top, spark_context)
        if location is None:
            continue
        shipped = location if location.endswith(".py") else os.path.dirname(location) + ".zip"
        raise SparkConfigError(
            f"{what}: {reference.qualname} is defined in module {reference.module!r} ({location}), which the "
            f"executors cannot import (only the driver's script folder holds it); ship it with "
            f"sc.addPyFile({shipped!r}) or spark-submit --py-files {shipped}, install it on the executors "
            f"(a wheel or a packed environment), or define it in the script itself (it then travels by value)"
        )


def check_shippable(obj: Any, what: str, spark_context: SparkContext | None, fix: str = "") -> None:
    """``obj`` can be pickled and everything it refers to by reference can be imported by the executors."""
    check_references(pickled_references(obj, what, fix), what, spark_context)


def check_network(network: TrainableNetwork, spark_context: SparkContext | None) -> None:
    """The user's code inside a network (a TorchNetwork's module, loss and optimizer) can be shipped."""
    if not isinstance(network, TorchNetwork):
        return  # a psrv.nn.Network travels as configuration and vectors: no user code
    parts = [("module", network.module), ("loss", network.loss_fn)]
    optimizer = network.optimizer
    if optimizer is not None and not isinstance(optimizer, type):
        parts.append(("optimizer", type(optimizer)))
    for name, part in parts:
        if part is not None:
            check_shippable(part, f"TorchNetwork {name}", spark_context,
                            "keep the module's state in tensors and plain attributes")


def check_loader(loader: Any, spark_context: SparkContext | None) -> None:
    """A minibatch loader has ``load(path)`` and can travel to the executors."""
    if loader is None:
        return
    if not callable(getattr(loader, "load", None)):
        raise SparkConfigError(
            f"loader: expected an object with a load(path) -> DataSet method, got a {type(loader).__name__} "
            "without one"
        )
    check_shippable(loader, "loader", spark_context,
                    "open files and locks inside load(path), not in the loader's constructor")


#: the Protocol (psrv.encoding.strategies) each training-master argument must meet, and its members
_STRATEGIES = {
    "threshold_algorithm": ("ThresholdAlgorithm", THRESHOLD_ALGORITHM_MEMBERS),
    "residual_post_processor": ("ResidualPostProcessor", POST_PROCESSOR_MEMBERS),
}


def check_strategy(name: str, strategy: Any, spark_context: SparkContext | None = None) -> None:
    """A threshold algorithm or residual post-processor meets its Protocol, its state is a dict msgpack
    can carry, and (given ``spark_context``) its class can reach the executors; else a SparkConfigError
    naming what is missing and the fix, on the driver."""
    protocol, members = _STRATEGIES[name]
    kind = type(strategy).__qualname__
    missing = missing_members(strategy, members)
    if missing:
        raise SparkConfigError(
            f"{name}: a {kind} is not a psrv.encoding.{protocol}: it has no {', '.join(missing)} "
            f"(a {protocol} has {', '.join(members)}; from_state and average are classmethods); "
            f"add {'it' if len(missing) == 1 else 'them'} (see README, 'Your own threshold algorithm')"
        )
    try:
        state = strategy.get_state()
        msgpack.packb(state, use_bin_type=True)
    except Exception as exc:  # noqa: BLE001 - whatever the user's get_state does wrong
        raise SparkConfigError(f"{name}: {kind}.get_state() must return a dict of plain values (numbers, "
                               f"strings, lists, dicts) that msgpack can write; it failed: "
                               f"{type(exc).__name__}: {_short(exc)}") from exc
    if not isinstance(state, dict):
        raise SparkConfigError(f"{name}: {kind}.get_state() must return a dict, got {type(state).__name__}")
    if spark_context is not None:
        check_shippable(type(strategy), name, spark_context)


__all__ = [
    "ByReference",
    "check_loader",
    "check_network",
    "check_references",
    "check_shippable",
    "check_strategy",
    "dumps_by_value",
    "pickled_references",
    "recording_pickle_module",
    "unshippable_module",
]
