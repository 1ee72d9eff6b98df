"""LeNet on Spark from a folder of images (DL4J's LeNet-on-Spark, on images made here: no download).

Draws small grey PNGs of four shapes (a horizontal bar, a vertical bar, a diagonal, a box) at random
places with noise, packs them into image batch files on the executors (``pack_images``: one minibatch
per file), trains psrv's LeNet (``psrv.nn``: conv 5x5 -> pool -> conv 5x5 -> pool -> dense -> softmax)
by parameter averaging with the updater state averaged too (``save_updater=True``), evaluates the test
images on the executors after each epoch, saves the network (parameters and updater state), loads it
back and checks the loaded copy predicts what the trained one does.

    spark-submit --master local-cluster[2,1,1024] examples/lenet_images.py
    python examples/lenet_images.py --epochs 5      # local[2]

Needs pillow (``pip install pillow``) to draw and decode the images.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import parser, report, spark_session  # noqa: E402

CLASSES = ("box", "diagonal", "horizontal", "vertical")
SIZE = 16
LABEL_PATTERN = r"_(?P<label>[a-z]+)\.png$"  # the class from the file name


def draw(kind: str, rng: np.random.Generator) -> np.ndarray:
    """One SIZE x SIZE grey image (uint8) of ``kind`` at a random place, with noise."""
    image = np.zeros((SIZE, SIZE))
    lo, hi = int(rng.integers(1, 5)), int(rng.integers(SIZE - 5, SIZE - 1))
    at = int(rng.integers(2, SIZE - 2))
    if kind == "horizontal":
        image[at - 1:at + 1, lo:hi] = 1.0
    elif kind == "vertical":
        image[lo:hi, at - 1:at + 1] = 1.0
    elif kind == "diagonal":
        steps = np.arange(lo, hi)
        image[steps, steps] = image[np.minimum(steps + 1, SIZE - 1), steps] = 1.0
    else:
        image[lo, lo:hi] = image[hi - 1, lo:hi] = image[lo:hi, lo] = image[lo:hi, hi - 1] = 1.0
    image += rng.normal(0.0, 0.2, image.shape)
    return (np.clip(image, 0.0, 1.0) * 255).astype(np.uint8)


def write_images(folder: str, count: int, seed: int) -> None:
    """``count`` PNGs named ``<number>_<class>.png``: sorted by name the classes come mixed, so each
    packed batch holds several classes."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    for i in range(count):
        kind = CLASSES[int(rng.integers(len(CLASSES)))]
        Image.fromarray(draw(kind, rng)).save(os.path.join(folder, f"{i:05d}_{kind}.png"))


def lenet(seed: int):
    from psrv.nn import Adam, Conv2D, Dense, MaxPool2D, Network, Output

    return Network([Conv2D(6, 5, padding="same"), MaxPool2D(2), Conv2D(12, 5, padding="same"), MaxPool2D(2),
                    Dense(32), Output(len(CLASSES))],
                   input_shape=(1, SIZE, SIZE), updater=Adam(3e-3), seed=seed)


def run(spark, args) -> dict:
    from psrv.nn import Network
    from psrv.spark import ParameterAveragingTrainingMaster, SparkNetwork
    from psrv.spark.data import ImageDataSetLoader, pack_images

    sc, work = spark.sparkContext, args.work
    write_images(os.path.join(work, "train"), args.train, args.seed)
    write_images(os.path.join(work, "test"), args.test, args.seed + 1)

    def pack(name: str, batch_size: int):  # labels from the file names: <number>_<class>.png
        return pack_images(os.path.join(work, name), os.path.join(work, f"{name}-batches"),
                           batch_size=batch_size, class_names=CLASSES, label_pattern=LABEL_PATTERN,
                           spark_context=sc, min_partitions=2)

    train, test = pack("train", args.batch), pack("test", 64)
    loader = ImageDataSetLoader(SIZE, SIZE, channels=1, num_classes=len(CLASSES))
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=args.batch,
                                              averaging_frequency=args.averaging, save_updater=True)
    started = time.monotonic()
    spark_net = SparkNetwork(sc, lenet(args.seed), master)
    train_paths, test_paths = sc.parallelize(train.paths, 2), sc.parallelize(test.paths, 2)
    accuracies = []
    for epoch in range(1, args.epochs + 1):
        spark_net.fit_paths(train_paths, loader)
        accuracies.append(spark_net.evaluate_paths(test_paths, loader).accuracy())
        print(f"epoch {epoch}: test accuracy {accuracies[-1]:.4f}")
    network = spark_net.get_network()
    saved = os.path.join(work, "lenet.psrvnn")
    network.save(saved)  # parameters, updater state and counters in one file
    loaded = Network.load(saved)
    test_sets = [loader.load(path) for path in test.paths]
    same = all(np.array_equal(network.predict(ds.features), loaded.predict(ds.features)) for ds in test_sets)
    same_updater = bool(np.array_equal(network.updater_state, loaded.updater_state))
    return {"test_accuracy": accuracies[-1], "accuracy_per_epoch": accuracies, "chance": 1 / len(CLASSES),
            "train_images": train.num_images, "test_images": test.num_images, "saved": saved,
            "test_batches": list(test.paths), "loaded_predicts_the_same": same,
            "updater_state_saved": same_updater and network.updater_state.size > 0,
            "seconds": round(time.monotonic() - started, 1)}


def arguments(argv=None):
    p = parser(__doc__)
    p.add_argument("--epochs", type=int, default=2, help="epochs (default 2)")
    p.add_argument("--train", type=int, default=480, help="training images (default 480)")
    p.add_argument("--test", type=int, default=256, help="test images (default 256)")
    p.add_argument("--batch", type=int, default=16, help="images per minibatch file (default 16)")
    p.add_argument("--averaging", type=int, default=5, help="minibatches between averagings (default 5)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = arguments(argv)
    with tempfile.TemporaryDirectory(prefix="psrv-lenet-") as temporary:
        args.work = args.work or temporary
        result = run(spark_session("psrv-example-lenet"), args)
        report("LeNet on generated images (parameter averaging)", result, args.json)


if __name__ == "__main__":
    main()
