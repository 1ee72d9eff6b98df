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
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import tempfile
import threading
import uuid
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any, Protocol
from urllib.parse import urlparse

from psrv.spark.errors import StorageError, StorageUnavailableError

if TYPE_CHECKING:
    from pyspark import SparkContext

OBJECT_STORE_SCHEMES = frozenset({"s3", "s3a", "s3n", "gs", "gcs"})
_TMP_PREFIX = ".psrv-"
_options: dict[str, dict[str, Any]] = {}
_lock = threading.Lock()
_counters = {"files_written": 0, "bytes_written": 0, "files_read": 0, "bytes_read": 0}


# --------------------------------------------------------------------------------------------------
# URIs
# --------------------------------------------------------------------------------------------------
def scheme_of(uri: str) -> str:
    scheme = urlparse(os.fspath(uri)).scheme.lower()
    return "" if len(scheme) == 1 else scheme  # "C:" on Windows is a drive, not a scheme


def is_local(uri: str | os.PathLike[str]) -> bool:
    """A plain path or a ``file:`` URI."""
    return scheme_of(os.fspath(uri)) in ("", "file")


def local_path(uri: str | os.PathLike[str]) -> str:
    """The local path a plain path or ``file:`` URI names (``file:///a``, ``file:/a`` -> ``/a``)."""
    text = os.fspath(uri)
    if scheme_of(text) == "file":
        parsed = urlparse(text)
        return parsed.path if not parsed.netloc or parsed.netloc == "localhost" else text
    return text


def absolute(uri: str | os.PathLike[str]) -> str:
    """Executors run in other working directories: a relative local path becomes absolute
    (``file:`` URIs stay URIs, ``file:///abs``); other URIs are returned as they are."""
    text = os.fspath(uri)
    if scheme_of(text) == "file":
        return "file://" + os.path.abspath(local_path(text))
    if scheme_of(text) == "":
        return os.path.abspath(text)
    return text


def join(base: str, *names: str) -> str:
    """``base/name/...`` for a path or URI (never ``os.path.join``: URIs use ``/``)."""
    out = os.fspath(base)
    for name in names:
        out = out.rstrip("/") + "/" + name.lstrip("/")
    return out


def parent(uri: str) -> str:
    text = os.fspath(uri).rstrip("/")
    head, _, _ = text.rpartition("/")
    return head or "/"


def _visible(name: str) -> bool:
    return not name.startswith((".", "_"))


# --------------------------------------------------------------------------------------------------
# options shipped to tasks
# --------------------------------------------------------------------------------------------------
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


# --------------------------------------------------------------------------------------------------
# backends
# --------------------------------------------------------------------------------------------------
class Storage(Protocol):
    """What psrv needs of a file system; every method takes full paths/URIs."""

    def open_read(self, uri: str) -> IO[bytes]: ...
    def open_write(self, uri: str) -> contextlib.AbstractContextManager[IO[bytes]]: ...
    def exists(self, uri: str) -> bool: ...
    def is_dir(self, uri: str) -> bool: ...
    def makedirs(self, uri: str) -> None: ...
    def list_files(self, uri: str, recursive: bool) -> list[str]: ...
    def delete(self, uri: str, recursive: bool) -> None: ...


class LocalStorage:
    """Plain paths and ``file:`` URIs; listings answer in the form the caller used."""

    def open_read(self, uri: str) -> IO[bytes]:
        try:
            return open(local_path(uri), "rb")  # noqa: SIM115 - handed to the caller
        except OSError as exc:
            raise StorageError(f"cannot read {uri!r}: {exc.strerror or exc}") from exc

    @contextlib.contextmanager
    def open_write(self, uri: str) -> Iterator[IO[bytes]]:
        """A temporary file in the target's directory, renamed over the target when the block ends."""
        path = os.path.abspath(local_path(uri))
        directory = os.path.dirname(path)
        try:
            os.makedirs(directory, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, suffix=".tmp", dir=directory)
        except OSError as exc:
            raise StorageError(f"cannot write {uri!r}: {exc.strerror or exc}") from exc
        try:
            from psrv.nn._files import current_umask

            os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp's file is private (0600): the user's umask
            with os.fdopen(fd, "wb") as handle:
                yield handle
            os.replace(tmp, path)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if isinstance(exc, OSError) and not isinstance(exc, StorageError):
                raise StorageError(f"cannot write {uri!r}: {exc.strerror or exc}") from exc
            raise

    def exists(self, uri: str) -> bool:
        return os.path.exists(local_path(uri))

    def is_dir(self, uri: str) -> bool:
        return os.path.isdir(local_path(uri))

    def makedirs(self, uri: str) -> None:
        try:
            os.makedirs(local_path(uri), exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create directory {uri!r}: {exc.strerror or exc}") from exc

    def list_files(self, uri: str, recursive: bool) -> list[str]:
        root = local_path(uri)
        as_uri = scheme_of(uri) == "file"
        out = []
        for current, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if _visible(d)) if recursive else []
            for name in files:
                if _visible(name):
                    full = os.path.join(current, name)
                    out.append("file://" + os.path.abspath(full) if as_uri else full)
        return sorted(out)

    def delete(self, uri: str, recursive: bool) -> None:
        import shutil

        path = local_path(uri)
        if os.path.isdir(path) and not os.path.islink(path):
            if recursive:
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.rmdir(path)
        elif os.path.lexists(path):
            os.unlink(path)


class FsspecStorage:
    """Any scheme fsspec knows (hdfs through pyarrow, s3/s3a through s3fs, gs, abfs ...)."""

    def __init__(self, scheme: str, options: dict[str, Any]) -> None:
        import fsspec

        self.scheme = scheme
        try:
            self.fs = fsspec.filesystem(scheme, **options)
        except Exception as exc:  # noqa: BLE001 - an import or connection error of the backend
            raise StorageUnavailableError(
                f"cannot open the {scheme}:// file system with fsspec: {exc}"
            ) from exc

    def open_read(self, uri: str) -> IO[bytes]:
        try:
            return self.fs.open(uri, "rb")
        except (OSError, ValueError) as exc:
            raise StorageError(f"cannot read {uri!r}: {exc}") from exc

    @contextlib.contextmanager
    def open_write(self, uri: str) -> Iterator[IO[bytes]]:
        direct = self.scheme in OBJECT_STORE_SCHEMES  # an object appears whole when its upload ends
        target = uri if direct else join(parent(uri), f"{_TMP_PREFIX}{uuid.uuid4().hex}.tmp")
        try:
            self.fs.makedirs(parent(uri), exist_ok=True)
            handle = self.fs.open(target, "wb")
        except (OSError, ValueError) as exc:
            raise StorageError(f"cannot write {uri!r}: {exc}") from exc
        try:
            with handle:
                yield handle
            if not direct:
                if self.fs.exists(uri):
                    self.fs.rm(uri)
                self.fs.mv(target, uri)
        except BaseException as exc:
            if not direct:
                with contextlib.suppress(Exception):
                    self.fs.rm(target)
            if isinstance(exc, OSError | ValueError) and not isinstance(exc, StorageError):
                raise StorageError(f"cannot write {uri!r}: {exc}") from exc
            raise

    def exists(self, uri: str) -> bool:
        return bool(self.fs.exists(uri))

    def is_dir(self, uri: str) -> bool:
        return bool(self.fs.isdir(uri))

    def makedirs(self, uri: str) -> None:
        try:
            self.fs.makedirs(uri, exist_ok=True)
        except (OSError, ValueError) as exc:
            raise StorageError(f"cannot create directory {uri!r}: {exc}") from exc

    def list_files(self, uri: str, recursive: bool) -> list[str]:
        found = self.fs.find(uri) if recursive else [
            e["name"] for e in self.fs.ls(uri, detail=True) if e.get("type") == "file"
        ]
        root = self.fs._strip_protocol(uri).rstrip("/")
        out = []
        for name in found:
            relative = str(name)[len(root):].lstrip("/") if str(name).startswith(root) else str(name)
            if all(_visible(part) for part in relative.split("/")):
                out.append(join(uri, relative))
        return sorted(out)

    def delete(self, uri: str, recursive: bool) -> None:
        if self.fs.exists(uri):
            self.fs.rm(uri, recursive=recursive)


class JvmHadoopStorage:
    """The driver's JVM Hadoop ``FileSystem`` through py4j: the cluster's configuration, no installs.

    Every byte crosses py4j, so it serves the driver's own small files only.
    """

    def __init__(self, spark_context: SparkContext) -> None:
        self.sc = spark_context
        self.jvm = spark_context._jvm

    def _fs(self, uri: str) -> tuple[Any, Any]:
        path = self.jvm.org.apache.hadoop.fs.Path(uri)
        return path.getFileSystem(self.sc._jsc.hadoopConfiguration()), path

    def _call(self, what: str, uri: str, fn: Any) -> Any:
        from py4j.protocol import Py4JJavaError

        try:
            return fn()
        except Py4JJavaError as exc:
            raise StorageError(
                f"cannot {what} {uri!r}: {exc.java_exception.toString()} (the driver's Hadoop file system; "
                f"fsspec has no {scheme_of(uri)}:// backend in this process either: pip install "
                "'psrv[storage]' and s3fs/gcsfs/adlfs as needed)"
            ) from exc

    def open_read(self, uri: str) -> IO[bytes]:
        import io

        def read() -> bytes:
            fs, path = self._fs(uri)
            stream = fs.open(path)
            try:
                return bytes(self.jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
            finally:
                stream.close()

        return io.BytesIO(self._call("read", uri, read))

    @contextlib.contextmanager
    def open_write(self, uri: str) -> Iterator[IO[bytes]]:
        import io

        buffer = io.BytesIO()
        yield buffer
        direct = scheme_of(uri) in OBJECT_STORE_SCHEMES

        def write() -> None:
            fs, path = self._fs(uri)
            target = path if direct else self.jvm.org.apache.hadoop.fs.Path(
                join(parent(uri), f"{_TMP_PREFIX}{uuid.uuid4().hex}.tmp"))
            stream = fs.create(target, True)
            try:
                stream.write(bytearray(buffer.getvalue()))
            finally:
                stream.close()
            if not direct:
                if fs.exists(path):
                    fs.delete(path, False)
                if not fs.rename(target, path):
                    fs.delete(target, False)
                    raise StorageError(f"cannot write {uri!r}: the rename into place failed")

        self._call("write", uri, write)

    def exists(self, uri: str) -> bool:
        return bool(self._call("check", uri, lambda: self._fs(uri)[0].exists(self._fs(uri)[1])))

    def is_dir(self, uri: str) -> bool:
        def check() -> bool:
            fs, path = self._fs(uri)
            return bool(fs.exists(path) and fs.getFileStatus(path).isDirectory())

        return bool(self._call("check", uri, check))

    def makedirs(self, uri: str) -> None:
        self._call("create directory", uri, lambda: self._fs(uri)[0].mkdirs(self._fs(uri)[1]))

    def list_files(self, uri: str, recursive: bool) -> list[str]:
        def listing() -> list[str]:
            fs, path = self._fs(uri)
            iterator = fs.listFiles(path, recursive)
            found = []
            while iterator.hasNext():
                found.append(str(iterator.next().getPath().toString()))
            return found

        root = str(self._call("list", uri, lambda: self._fs(uri)[1].toString())).rstrip("/")
        out = []
        for name in self._call("list", uri, listing):
            relative = name.split(root, 1)[-1].lstrip("/") if root in name else name.rsplit("/", 1)[-1]
            if all(_visible(part) for part in relative.split("/")):
                out.append(join(uri, relative))
        return sorted(out)

    def delete(self, uri: str, recursive: bool) -> None:
        self._call("delete", uri, lambda: self._fs(uri)[0].delete(self._fs(uri)[1], recursive))


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


def basename(uri: str) -> str:
    return posixpath.basename(os.fspath(uri).rstrip("/"))


__all__ = [
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
    "open_input",
    "open_output",
    "read_bytes",
    "scheme_of",
    "storage_for",
    "use_hadoop_configuration",
    "write_bytes",
]
