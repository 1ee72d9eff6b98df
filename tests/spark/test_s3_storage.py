"""The storage layer against a real S3-compatible HTTP server (moto's, on 127.0.0.1): the driver's
Hadoop S3A settings reach the tasks, executors write and read s3a:// objects themselves."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

from psrv.nn import Adam, Dense, Network, Output  # noqa: E402
from psrv.nn.data import DataSet, FileDataSetLoader  # noqa: E402
from psrv.spark import ParameterAveragingTrainingMaster, SparkNetwork, storage  # noqa: E402
from psrv.spark.data import batch_and_export, list_paths  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]
_S3A = {"fs.s3a.access.key": "testing", "fs.s3a.secret.key": "testing",
        "fs.s3a.endpoint.region": "us-east-1", "fs.s3a.path.style.access": "true"}


@pytest.fixture
def s3_bucket(spark_context) -> Iterator[str]:
    """A bucket on a fresh moto S3 server; Spark's Hadoop configuration points S3A at it."""
    import boto3

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket="psrv")
    conf = spark_context._jsc.hadoopConfiguration()
    saved = storage.current_options()
    for key, value in {**_S3A, "fs.s3a.endpoint": endpoint}.items():
        conf.set(key, value)
    try:
        yield "s3a://psrv"
    finally:
        for key in (*_S3A, "fs.s3a.endpoint"):
            conf.unset(key)
        storage.configure(saved)
        server.stop()


def test_s3a_export_train_save_and_reuse(spark_context, digits, s3_bucket: str) -> None:
    train, test = digits
    options = storage.use_hadoop_configuration(spark_context)
    assert options["s3a"]["client_kwargs"]["endpoint_url"].startswith("http://127.0.0.1:")

    # batch_and_export: the executors write the objects; listed and read back through s3a://
    rdd = spark_context.parallelize(list(train.batches(100)), 2)
    paths = batch_and_export(rdd, 32, f"{s3_bucket}/export")
    assert paths and all(p.startswith("s3a://psrv/export/") for p in paths)
    assert list_paths(spark_context, f"{s3_bucket}/export") == paths
    assert DataSet.merge(FileDataSetLoader().load(p) for p in paths).num_examples == train.num_examples

    # the export approach with an s3a:// export_directory: written once, reused, never deleted
    network = Network([Dense(32, "relu"), Output(10)], input_shape=(64,), updater=Adam(1e-2), seed=2)
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=32, averaging_frequency=10,
                                              export_directory=f"{s3_bucket}/exports")
    with SparkNetwork(spark_context, network, master) as net:
        net.fit(rdd)
        net.fit(rdd)
        assert master._exports.stats()["exports_written"] == 1 and master._exports.stats()["reused"] == 1
        net.fit_paths(spark_context.parallelize(paths, 2))
        # the same objects as an RDD of paths, and fit straight from the s3a:// directory
        assert sorted(list_paths(spark_context, f"{s3_bucket}/export", as_rdd=True).collect()) == paths
        epoch = network.epoch
        net.fit(f"{s3_bucket}/export")
        assert network.epoch == epoch + 1
        evaluation = net.evaluate(spark_context.parallelize([test], 2))
        net.save_evaluations([evaluation], f"{s3_bucket}/results/eval.json")
        assert net.load_evaluations(f"{s3_bucket}/results/eval.json")[0].accuracy() == evaluation.accuracy()
        net.get_network().save(f"{s3_bucket}/models/net.psrv")
    kept = storage.list_files(f"{s3_bucket}/exports")
    assert kept and all(p.endswith(".psds") for p in kept)  # a user-given export_directory is kept
    back = Network.load(f"{s3_bucket}/models/net.psrv")
    np.testing.assert_array_equal(back.params, network.params)
