"""The file systems behind psrv's storage layer: the local one, fsspec's (any Hadoop-FS scheme inside
tasks), and the driver's JVM Hadoop ``FileSystem`` (py4j) for what fsspec cannot open there.

:mod:`psrv.spark.storage` picks one per URI; this module only says how each reads, writes and lists.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any, Protocol

from psrv.nn._files import TMP_PREFIX, atomic_local_writer
from psrv.spark.errors import StorageError, StorageUnavailableError
from psrv.spark.storage_uris import OBJECT_STORE_SCHEMES, is_visible, join, local_path, parent, scheme_of

if TYPE_CHECKING:
    from pyspark import SparkContext

__all__ = ["FsspecStorage", "JvmHadoopStorage", "LocalStorage", "Storage"]


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
        try:
            with atomic_local_writer(local_path(uri)) as handle:
                yield handle
        except OSError as exc:
            if isinstance(exc, StorageError):
                raise
            raise StorageError(f"cannot write {uri!r}: {exc.strerror or exc}") from exc

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
            dirs[:] = sorted(d for d in dirs if is_visible(d)) if recursive else []
            for name in files:
                if is_visible(name):
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
        target = uri if direct else join(parent(uri), f"{TMP_PREFIX}{uuid.uuid4().hex}.tmp")
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
            if all(is_visible(part) for part in relative.split("/")):
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
                join(parent(uri), f"{TMP_PREFIX}{uuid.uuid4().hex}.tmp"))
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
            if all(is_visible(part) for part in relative.split("/")):
                out.append(join(uri, relative))
        return sorted(out)

    def delete(self, uri: str, recursive: bool) -> None:
        self._call("delete", uri, lambda: self._fs(uri)[0].delete(self._fs(uri)[1], recursive))
