"""psrv.spark.ml: Spark ML Estimators and Transformers around psrv networks (Horovod's TorchEstimator shape).

``TorchEstimator(module, loss, optimizer, input_shape, ...).fit(df)`` trains a ``TorchNetwork`` on Spark
(``SparkNetwork.fit`` with epochs, validation, callbacks and checkpoints) and returns a ``TorchModel``,
a Transformer whose ``transform(df)`` adds a prediction column (class index for classification, the value
for regression) and a probability column (classification) in one distributed pass, the network shipped
once per executor. The loss decides how the model predicts (psrv.nn.output_semantics); every setting
that is a plain value is a Spark ML Param (psrv.spark.ml.params), and the unfitted estimators save and
load too. ``NetworkEstimator`` does the same for a ``psrv.nn.Network``. Both are plain
``pyspark.ml`` stages, so they sit in a ``Pipeline`` (e.g. after a ``VectorAssembler``). Features may be
one array column, one ML Vector column, or several numeric / array / Vector columns (concatenated).

Saved pipelines name the model class ``psrv.spark.ml.TorchModel``; it is importable from here.
"""

from __future__ import annotations

from psrv.spark.ml.estimator import NetworkEstimator, TorchEstimator
from psrv.spark.ml.model import TorchModel
from psrv.spark.ml.persistence import ESTIMATOR_FILE, FORMAT, FORMAT_VERSION, MODEL_FILE

__all__ = ["ESTIMATOR_FILE", "FORMAT", "FORMAT_VERSION", "MODEL_FILE", "NetworkEstimator", "TorchEstimator",
           "TorchModel"]
