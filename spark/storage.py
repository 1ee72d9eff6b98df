"""One storage layer for every path psrv reads or writes: local paths, ``file://`` and any Hadoop-FS URI.

The same Python code runs on the driver and inside Spark tasks, so executors read and write their
files themselves (nothing is funnelled through the driver):

- plain paths and ``file:`` URIs: the local file system (no extra installs); writes are atomic
  (a temporary file in the same directory, then ``os.replace``).
- any other scheme (``hdfs://``, ``s3a://``, ``abfs://``, ``gs://`` ...): ``fsspec`` (the optional
  extra ``psrv[storage]`` installs fsspec and pyarrow; S3/GCS/Azure need s3fs/gcsfs/adlfs). Writes go
  to a hidden temporary name and are renamed into place where rename is atomic (HDFS, ABFS with a
  hierarchical namespace); on object stores (``s3``, ``s3a``, ``gs``, ``gcs``) an object is written
  directly, because an upload only becomes visible whole when it completes and a rename is a copy.
- ``file:`` URIs go through fsspec too when options are configured for the ``file`` scheme
  (``configure({"file": {}})``): the tests run the generic path that way, with no server.
- on the driver only, a URI fsspec cannot open falls back to the JVM's Hadoop ``FileSystem`` through
  py4j (the cluster's own configuration, no installs): right for the driver's small files (networks,
  evaluations, reports, checkpoints, listings), never used inside a task (Python workers have no
  JVM gateway).

The driver copies the Hadoop configuration's S3A settings (``fs.s3a.endpoint``,
``endpoint.region``, ``access.key``, ``secret.key``, ``path.style.access``) into the fsspec options
(:func:`use_hadoop_configuration`); code that ships work to tasks carries :func:`current_options`
with it and calls :func:`configure` there.

Importing this module (``import psrv.spark`` does) hands :func:`read_bytes` and :func:`write_bytes` to
psrv.nn, so ``Network.save``/``load`` and the data files reach every URI this layer reaches. The
backends live in :mod:`psrv.spark.storage_backends`, the URI helpers in :mod:`psrv.spark.storage_uris`.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any

from psrv.nn import _files as nn_files
from psrv.spark.errors import StorageError, StorageUnavailableError
from psrv.spark.storage_backends import FsspecStorage, JvmHadoopStorage, LocalStorage, Storage
from psrv.spark.storage_uris import (
    OBJECT_STORE_SCHEMES,
    absolute,
    basename,
    is_local,
    join,
    local_path,
    parent,
    scheme_of,
)

if TYPE_CHECKING:
    from pyspark import SparkContext

_options: dict[str, dict[str, Any]] = {}
_lock = threading.Lock()
_counters = {"files_written": 0, "bytes_written": 0, "files_read": 0, "bytes_read": 0}


def configure(options: dict[str, dict[str, Any]] | None) -> None:
    """Set the fsspec options per scheme in this process (tasks call it with what the driver sent)."""
    if options is None:
        return
    with _lock:
        _options.clear()
        _options.update({k: dict(v) for k, v in options.items()})


def current_options() -> dict[str, dict[str, Any]]:
    with _lock:
        return {k: dict(v) for k, v in _options.items()}


def use_hadoop_configuration(spark_context: SparkContext) -> dict[str, dict[str, Any]]:
    """Copy the S3A settings of Spark's Hadoop configuration into the fsspec options (driver)."""
    try:
        conf = spark_context._jsc.hadoopConfiguration()
    except Exception:  # noqa: BLE001 - no JVM (a stopped context): keep what is set
        return current_options()
    s3: dict[str, Any] = {}
    endpoint = conf.get("fs.s3a.endpoint")
    if endpoint:
        if "://" not in endpoint:
            secure = str(conf.get("fs.s3a.connection.ssl.enabled") or "true").lower() == "true"
            endpoint = ("https://" if secure else "http://") + endpoint
        s3.setdefault("client_kwargs", {})["endpoint_url"] = endpoint
    region = conf.get("fs.s3a.endpoint.region")
    if region:
        s3.setdefault("client_kwargs", {})["region_name"] = region
    key, secret = conf.get("fs.s3a.access.key"), conf.get("fs.s3a.secret.key")
    if key and secret:
        s3["key"], s3["secret"] = key, secret
    if str(conf.get("fs.s3a.path.style.access") or "").lower() == "true":
        s3.setdefault("config_kwargs", {})["s3"] = {"addressing_style": "path"}
    options = current_options()
    if s3:
        for scheme in ("s3", "s3a", "s3n"):
            options[scheme] = {**options.get(scheme, {}), **s3}
    configure(options)
    return options


def counters() -> dict[str, int]:
    """Files and bytes this process read and wrote through the storage layer (for tests and benchmarks)."""
    with _lock:
        return dict(_counters)


def _count(kind: str, nbytes: int) -> None:
    with _lock:
        _counters[f"files_{kind}"] += 1
        _counters[f"bytes_{kind}"] += nbytes


_LOCAL = LocalStorage()
_fsspec_cache: dict[tuple[str, str], FsspecStorage] = {}


def _fsspec_available(scheme: str) -> bool:
    try:
        import fsspec

        fsspec.get_filesystem_class(scheme)
        return True
    except (ImportError, ValueError):
        return False


def _driver_context() -> SparkContext | None:
    try:
        from pyspark import SparkContext
    except ImportError:  # pragma: no cover - pyspark is a dependency
        return None
    context = SparkContext._active_spark_context
    return context if context is not None and getattr(context, "_jsc", None) is not None else None


def storage_for(uri: str | os.PathLike[str]) -> Storage:
    """The backend for ``uri`` in this process (see the module docstring for the order)."""
    text = os.fspath(uri)
    scheme = scheme_of(text)
    routed = scheme in current_options() and _fsspec_available(scheme)  # file:// given options: fsspec
    if scheme in ("", "file") and not routed:
        return _LOCAL
    if routed or _fsspec_available(scheme):
        options = current_options().get(scheme, {})
        key = (scheme, repr(sorted(options.items())))
        with _lock:
            cached = _fsspec_cache.get(key)
        if cached is None:
            cached = FsspecStorage(scheme, options)
            with _lock:
                _fsspec_cache[key] = cached
        return cached
    context = _driver_context()  # None inside a task: Python workers have no JVM gateway
    if context is not None:
        return JvmHadoopStorage(context)
    raise StorageUnavailableError(
        f"no file system for {text!r} in this process: install fsspec with the backend for "
        f"{scheme}:// (pip install 'psrv[storage]' brings fsspec and pyarrow for hdfs://; s3fs, gcsfs or "
        "adlfs for s3a://, gs://, abfs://) on the driver and on every executor"
    )


def reachable_in_tasks(uri: str) -> bool:
    """Whether Spark tasks can open ``uri`` themselves (local, or a scheme fsspec has here)."""
    scheme = scheme_of(uri)
    return scheme in ("", "file") or _fsspec_available(scheme)


def check_task_access(uri: str, what: str) -> None:
    """On the driver, before a job: tasks will read or write ``uri`` themselves, so the scheme needs a
    backend that works without the JVM (fsspec); fail here, clearly, rather than in every task."""
    scheme = scheme_of(uri)
    if scheme in ("", "file") or _fsspec_available(scheme):
        return
    raise StorageUnavailableError(
        f"{what} {uri!r}: Spark tasks read and write it themselves, which for {scheme}:// needs fsspec "
        "(pip install 'psrv[storage]', plus s3fs/gcsfs/adlfs for object stores) on the driver and every "
        "executor; or use a local/shared file:// path"
    )


# --------------------------------------------------------------------------------------------------
# the functions the rest of psrv calls
# --------------------------------------------------------------------------------------------------
def open_input(uri: str | os.PathLike[str]) -> IO[bytes]:
    """A readable binary stream of ``uri`` (close it, or use it in ``with``)."""
    return storage_for(uri).open_read(os.fspath(uri))


@contextlib.contextmanager
def open_output(uri: str | os.PathLike[str]) -> Iterator[IO[bytes]]:
    """A writable binary stream; the file appears under ``uri`` only when the block ends without error
    (atomically where the file system renames atomically: see the module docstring)."""
    text = os.fspath(uri)
    with storage_for(text).open_write(text) as handle:
        counting = _CountingWriter(handle)
        yield counting  # type: ignore[misc]
    _count("written", counting.count)


class _CountingWriter:
    def __init__(self, handle: IO[bytes]) -> None:
        self.handle = handle
        self.count = 0

    def write(self, data: Any) -> int:
        written = self.handle.write(data)
        size = len(memoryview(data).cast("B")) if written is None else int(written)
        self.count += size
        return size

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)


def read_bytes(uri: str | os.PathLike[str]) -> bytes:
    with open_input(uri) as handle:
        data = handle.read()
    _count("read", len(data))
    return data


def write_bytes(uri: str | os.PathLike[str], data: bytes | bytearray | memoryview) -> None:
    """Write one whole file (atomically where the file system allows: see the module docstring)."""
    with open_output(uri) as handle:
        handle.write(data)


def exists(uri: str | os.PathLike[str]) -> bool:
    return storage_for(uri).exists(os.fspath(uri))


def is_dir(uri: str | os.PathLike[str]) -> bool:
    return storage_for(uri).is_dir(os.fspath(uri))


def makedirs(uri: str | os.PathLike[str]) -> None:
    storage_for(uri).makedirs(os.fspath(uri))


def delete(uri: str | os.PathLike[str], *, recursive: bool = True) -> None:
    """Remove a file or a directory tree (a missing one is fine)."""
    storage_for(uri).delete(os.fspath(uri), recursive)


def list_files(
    uri: str | os.PathLike[str], *, suffix: str | None = None, recursive: bool = True
) -> list[str]:
    """Sorted files under a directory (hidden and ``_``-prefixed names, like _SUCCESS, skipped), in the
    form the caller used (a plain path lists plain paths, a URI lists URIs)."""
    text = os.fspath(uri)
    backend = storage_for(text)
    if not backend.is_dir(text):
        raise StorageError(f"{text!r} is not a directory")
    found = backend.list_files(text, recursive)
    return [p for p in found if suffix is None or p.endswith(suffix)]


__all__ = [
    "OBJECT_STORE_SCHEMES",
    "FsspecStorage",
    "JvmHadoopStorage",
    "LocalStorage",
    "Storage",
    "absolute",
    "basename",
    "check_task_access",
    "configure",
    "counters",
    "current_options",
    "delete",
    "exists",
    "is_dir",
    "is_local",
    "join",
    "list_files",
    "local_path",
    "makedirs",
    "parent",
    "open_input",
    "open_output",
    "reachable_in_tasks",
    "read_bytes",
    "scheme_of",
    "storage_for",
    "use_hadoop_configuration",
    "write_bytes",
]

nn_files.use_storage(read_bytes, write_bytes)
