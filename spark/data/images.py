"""Image pipelines: pack image files into batch files of encoded bytes; decode them for training.

Packing keeps the images encoded (PNG/JPEG bytes as they are; other formats re-encoded as PNG),
so a batch file is about as small as the images themselves and the network transfer stays small.
Labels come from class subfolders (``root/cat/1.png`` -> "cat") or from the file name by a regular
expression (its group ``label`` or group 1). Class names are given, or collected (sorted).

The batch file is the psrv data file form (``psrv.nn.data``) of kind ``"ImageBatch"``: the bytes of
all images back to back, their offsets, integer labels, and the class names and file names as JSON.
``ImageDataSetLoader`` (a ``DataSetLoader``) decodes, resizes and scales a batch to a DataSet.
Pillow is needed for decoding and re-encoding (``pip install pillow``).
"""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from psrv.nn.data import DataSet, decode_arrays, encode_arrays, one_hot
from psrv.nn.errors import DataFileError
from psrv.spark import storage
from psrv.spark.data.files import list_local_paths, write_bytes
from psrv.spark.errors import SparkConfigError, SparkInputError

if TYPE_CHECKING:
    from pyspark import SparkContext

__all__ = [
    "IMAGE_BATCH_SUFFIX",
    "IMAGE_EXTENSIONS",
    "ImageBatch",
    "ImageDataSetLoader",
    "PackedImages",
    "decode_image",
    "label_of",
    "pack_images",
]

IMAGE_BATCH_KIND = "ImageBatch"
IMAGE_BATCH_SUFFIX = ".psimg"
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_JPEG_MAGIC = b"\xff\xd8\xff"


def _pillow() -> Any:
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - pillow is installed with the test extras
        raise SparkConfigError("image pipelines need Pillow: pip install pillow") from exc
    return Image


def _json_array(value: Any) -> np.ndarray:
    return np.frombuffer(json.dumps(value).encode("utf-8"), dtype=np.uint8)


def _from_json_array(array: np.ndarray) -> Any:
    return json.loads(array.tobytes().decode("utf-8"))


@dataclass
class ImageBatch:
    """Encoded images with integer labels (indices into ``class_names``) and their file names."""

    images: list[bytes]
    labels: np.ndarray
    class_names: list[str]
    names: list[str]

    def __post_init__(self) -> None:
        self.labels = np.asarray(self.labels, dtype=np.int64).reshape(-1)
        if not (len(self.images) == self.labels.shape[0] == len(self.names)):
            raise SparkInputError(
                f"ImageBatch: {len(self.images)} images, {self.labels.shape[0]} labels and {len(self.names)} "
                "names; expected equal counts"
            )
        if self.labels.size and (self.labels.min() < 0 or self.labels.max() >= len(self.class_names)):
            raise SparkInputError(f"ImageBatch: labels outside [0, {len(self.class_names)})")

    @property
    def num_examples(self) -> int:
        return len(self.images)

    def to_bytes(self) -> bytes:
        sizes = np.array([len(b) for b in self.images], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        data = np.frombuffer(b"".join(self.images), dtype=np.uint8)
        return encode_arrays(
            IMAGE_BATCH_KIND,
            [
                ("data", data),
                ("offsets", offsets),
                ("labels", self.labels),
                ("class_names", _json_array(self.class_names)),
                ("names", _json_array(self.names)),
            ],
        )

    @classmethod
    def from_bytes(cls, blob: bytes | bytearray | memoryview, source: str = "<bytes>") -> ImageBatch:
        kind, arrays = decode_arrays(blob, source)
        if kind != IMAGE_BATCH_KIND:
            raise DataFileError(
                f"{source}: holds a {kind}, expected an {IMAGE_BATCH_KIND} (pack_images output)"
            )
        try:
            data, offsets = arrays["data"].tobytes(), arrays["offsets"]
            if (
                offsets.ndim != 1
                or offsets[0] != 0
                or offsets[-1] != len(data)
                or np.any(np.diff(offsets) < 0)
            ):
                raise DataFileError(f"{source}: corrupt image batch: offsets do not match the data")
            images = [data[int(a) : int(b)] for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
            return cls(
                images,
                arrays["labels"],
                _from_json_array(arrays["class_names"]),
                _from_json_array(arrays["names"]),
            )
        except KeyError as exc:
            raise DataFileError(f"{source}: image batch lacks array {exc}") from exc
        except (ValueError, SparkInputError) as exc:
            raise DataFileError(f"{source}: corrupt image batch ({exc})") from exc

    def save(self, path: str) -> None:
        write_bytes(path, self.to_bytes())

    @classmethod
    def load(cls, path: str) -> ImageBatch:
        """Read a batch file from any path or URI the storage layer reaches."""
        try:
            blob = storage.read_bytes(path)
        except OSError as exc:
            raise DataFileError(f"{path}: cannot read image batch ({exc})") from exc
        return cls.from_bytes(blob, path)


# --------------------------------------------------------------------------------------------------
# labels and encoding
# --------------------------------------------------------------------------------------------------
def label_of(path: str, label_pattern: str | re.Pattern[str] | None = None) -> str:
    """The class label of an image: its parent folder's name, or from the file name by a regex."""
    parts = path.replace("\\", "/").rstrip("/").split("/")
    if label_pattern is None:
        if len(parts) < 2 or not parts[-2]:
            raise SparkInputError(f"{path!r}: no parent folder to take the class label from")
        return parts[-2]
    pattern = re.compile(label_pattern) if isinstance(label_pattern, str) else label_pattern
    match = pattern.search(parts[-1])
    if match is None:
        raise SparkInputError(f"file name {parts[-1]!r} does not match the label pattern {pattern.pattern!r}")
    if "label" in pattern.groupindex:
        return match.group("label")
    return match.group(1) if pattern.groups else match.group(0)


def _is_image(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return not name.startswith((".", "_")) and name.lower().endswith(IMAGE_EXTENSIONS)


def _compact(blob: bytes, name: str) -> bytes:
    """PNG/JPEG bytes as they are; anything else Pillow reads, re-encoded as PNG."""
    if blob.startswith(_PNG_MAGIC) or blob.startswith(_JPEG_MAGIC):
        return bytes(blob)
    image_module = _pillow()
    try:
        with image_module.open(io.BytesIO(blob)) as image:
            out = io.BytesIO()
            image.save(out, format="PNG")
            return out.getvalue()
    except Exception as exc:  # noqa: BLE001 - Pillow raises many types for bad files
        raise SparkInputError(f"{name}: not a readable image ({exc})") from exc


def decode_image(
    blob: bytes, height: int, width: int, channels: int = 3, *, name: str = "<image>"
) -> np.ndarray:
    """Encoded bytes to a uint8 array (height, width, channels), resized (bilinear) and converted."""
    if channels not in (1, 3):
        raise SparkConfigError(f"channels: expected 1 (grey) or 3 (RGB), got {channels}")
    image_module = _pillow()
    try:
        with image_module.open(io.BytesIO(blob)) as image:
            converted = image.convert("L" if channels == 1 else "RGB")
            if converted.size != (width, height):
                converted = converted.resize((width, height), image_module.Resampling.BILINEAR)
            array = np.asarray(converted, dtype=np.uint8)
    except Exception as exc:  # noqa: BLE001 - Pillow raises many types for bad files
        raise DataFileError(f"{name}: cannot decode image ({exc})") from exc
    return array.reshape(height, width, channels)


class ImageDataSetLoader:
    """Loads an image batch file as a DataSet: decode, resize to (height, width), scale to [0, 1].

    Features are float32 ``(n, channels, height, width)`` (``channels_first=True``, as psrv's Conv2D
    takes) or ``(n, height, width, channels)``; labels one-hot over the batch's class names.
    """

    def __init__(
        self,
        height: int,
        width: int,
        channels: int = 3,
        *,
        channels_first: bool = True,
        scale: bool = True,
        num_classes: int | None = None,
    ) -> None:
        if height < 1 or width < 1:
            raise SparkConfigError(f"height/width: expected positive sizes, got {height}x{width}")
        if channels not in (1, 3):
            raise SparkConfigError(f"channels: expected 1 (grey) or 3 (RGB), got {channels}")
        self.height, self.width, self.channels = int(height), int(width), int(channels)
        self.channels_first, self.scale, self.num_classes = channels_first, scale, num_classes

    def decode(self, batch: ImageBatch) -> DataSet:
        num_classes = self.num_classes if self.num_classes is not None else len(batch.class_names)
        if num_classes < len(batch.class_names):
            raise DataFileError(
                f"image batch has {len(batch.class_names)} classes, loader expects {self.num_classes}"
            )
        pixels = (
            np.stack(
                [
                    decode_image(blob, self.height, self.width, self.channels, name=name)
                    for blob, name in zip(batch.images, batch.names, strict=True)
                ]
            )
            if batch.num_examples
            else np.zeros((0, self.height, self.width, self.channels), np.uint8)
        )
        features = pixels.astype(np.float32)
        if self.scale:
            features /= 255.0
        if self.channels_first:
            features = np.ascontiguousarray(features.transpose(0, 3, 1, 2))
        return DataSet(features, one_hot(batch.labels, num_classes))

    def load(self, path: str) -> DataSet:
        return self.decode(ImageBatch.load(path))

    def load_stream(self, stream: Any, path: str) -> DataSet:
        """What a Spark task calls: the batch file as a stream opened by the storage layer."""
        return self.decode(ImageBatch.from_bytes(stream.read(), path))

    def __repr__(self) -> str:
        return (
            f"ImageDataSetLoader({self.height}x{self.width}x{self.channels}, "
            f"channels_first={self.channels_first}, scale={self.scale})"
        )


# --------------------------------------------------------------------------------------------------
# packing
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PackedImages:
    """What :func:`pack_images` wrote: the batch files (sorted) and the class names, in label order."""

    paths: list[str]
    class_names: list[str]
    num_images: int


@dataclass(frozen=True)
class _Packer:
    """Groups (path, bytes) items into ImageBatches of ``batch_size`` and writes or returns them."""

    directory: str
    batch_size: int
    class_names: tuple[str, ...]
    label_pattern: str | None
    write_here: bool
    options: dict | None = None

    def label(self, path: str) -> int:
        name = label_of(path, self.label_pattern)
        if name not in self.class_names:
            raise SparkInputError(
                f"{path}: class {name!r} is not among the class names {list(self.class_names)}"
            )
        return self.class_names.index(name)

    def batches(self, items: Iterable[tuple[str, bytes]]) -> Iterator[ImageBatch]:
        images: list[bytes] = []
        labels: list[int] = []
        names: list[str] = []
        for path, blob in items:
            images.append(_compact(blob, path))
            labels.append(self.label(path))
            names.append(path.rsplit("/", 1)[-1])
            if len(images) == self.batch_size:
                yield ImageBatch(images, np.array(labels), list(self.class_names), names)
                images, labels, names = [], [], []
        if images:
            yield ImageBatch(images, np.array(labels), list(self.class_names), names)

    def __call__(
        self, partition: int, items: Iterable[tuple[str, bytes]]
    ) -> Iterator[tuple[str, bytes | None, int]]:
        """(path, bytes to write on the driver or None when written here, images in the batch)."""
        storage.configure(self.options)
        for number, batch in enumerate(self.batches(items)):
            path = storage.join(self.directory, f"images-{partition:05d}-{number:06d}{IMAGE_BATCH_SUFFIX}")
            if self.write_here:
                write_bytes(path, batch.to_bytes())
                yield path, None, batch.num_examples
            else:
                yield path, batch.to_bytes(), batch.num_examples


def _resolve_classes(found: Iterable[str], class_names: Sequence[str] | None) -> tuple[str, ...]:
    if class_names is not None:
        names = tuple(str(c) for c in class_names)
        if len(set(names)) != len(names):
            raise SparkConfigError(f"class_names: duplicates in {list(names)}")
        return names
    names = tuple(sorted(set(found)))
    if not names:
        raise SparkInputError("no images found to collect class names from")
    return names


def pack_images(
    source: str,
    output: str,
    *,
    batch_size: int = 32,
    class_names: Sequence[str] | None = None,
    label_pattern: str | None = None,
    spark_context: SparkContext | None = None,
    min_partitions: int | None = None,
    through_driver: bool = False,
) -> PackedImages:
    """Pack the images under ``source`` into batch files under ``output``.

    Without ``label_pattern`` the images sit in class subfolders (``source/<class>/<file>``); with it,
    directly in ``source`` and the pattern takes the label from each file name. With
    ``spark_context`` the images are read with ``binaryFiles`` (any Hadoop URI) and packed and written
    by the executors through the storage layer (``through_driver=True``: written by the driver, for
    executors that cannot reach ``output``'s file system). Images are ordered by path.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise SparkConfigError(f"batch_size: expected a positive int, got {batch_size!r}")
    if label_pattern is not None:
        re.compile(label_pattern)  # a bad pattern fails here, clearly, not in an executor
    directory = storage.absolute(output)
    if spark_context is None:
        root = storage.local_path(source)
        if not os.path.isdir(root):
            raise SparkInputError(f"{source!r} is not a directory")
        files = [p for p in list_local_paths(root, recursive=label_pattern is None) if _is_image(p)]
        if label_pattern is None:
            files = [p for p in files if os.path.dirname(os.path.dirname(p)) == root.rstrip("/")]
        classes = _resolve_classes((label_of(p, label_pattern) for p in files), class_names)
        packer = _Packer(directory, batch_size, classes, label_pattern, True)

        def read(path: str) -> tuple[str, bytes]:
            return path, storage.read_bytes(path)

        paths = [p for p, _, _ in packer(0, (read(p) for p in files))]
        return PackedImages(sorted(paths), list(classes), len(files))

    pattern = source.rstrip("/") + ("/*/*" if label_pattern is None else "/*")
    images = spark_context.binaryFiles(pattern, min_partitions).filter(lambda kv: _is_image(kv[0]))
    images = images.sortByKey()
    if class_names is None:
        found = images.keys().map(lambda p: label_of(p, label_pattern)).distinct().collect()
    else:
        found = []
    classes = _resolve_classes(found, class_names)
    if not through_driver:
        storage.check_task_access(directory, "pack_images: output")
    options = storage.use_hadoop_configuration(spark_context)
    packer = _Packer(directory, batch_size, classes, label_pattern, not through_driver, options)
    produced = images.mapPartitionsWithIndex(packer)
    paths, count = [], 0
    for path, blob, n in produced.collect() if not through_driver else produced.toLocalIterator():
        if blob is not None:
            write_bytes(path, blob, spark_context)
        paths.append(path)
        count += n
    return PackedImages(sorted(paths), list(classes), count)
