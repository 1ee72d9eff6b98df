"""psrv.spark.ml as a Spark ML citizen: regression and binary models predict what their loss trained for
(the module's own output on the same rows, not a constant); labels a loss cannot take are refused before
training; Params drive CrossValidator; an unfitted Pipeline holding the estimator saves and loads;
validation as a fraction or a column reaches the history and the metrics loggers."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from psrv.nn.errors import ConfigError  # noqa: E402
from psrv.spark import ParameterAveragingTrainingMaster  # noqa: E402
from psrv.spark.errors import SparkInputError  # noqa: E402
from psrv.spark.ml import NetworkEstimator, TorchEstimator, TorchModel  # noqa: E402
from psrv.spark.ml import estimator as ml_estimator  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

COLUMNS = ["x0", "x1", "x2", "x3"]


class Sink:
    """A metrics logger as a user writes one: it keeps what it is given."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, dict]] = []

    def on_metrics(self, step, epoch, metrics) -> None:
        self.calls.append((step, epoch, dict(metrics)))


def _master() -> ParameterAveragingTrainingMaster:
    return ParameterAveragingTrainingMaster(batch_size_per_worker=16, averaging_frequency=2)


def _frame(spark, rows: int = 400, seed: int = 3):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 4))
    value = x @ np.array([1.5, -2.0, 0.5, 1.0]) + 0.3
    records = [(i, *map(float, r), float(v), int(r[0] + r[1] > 0), bool(i % 5 == 0))
               for i, (r, v) in enumerate(zip(x, value, strict=True))]
    return spark.createDataFrame(records, ["id", *COLUMNS, "value", "label", "is_val"]).repartition(2)


def _module_output(model: TorchModel, rows) -> np.ndarray:
    features = torch.tensor([[r[c] for c in COLUMNS] for r in rows], dtype=torch.float32)
    with torch.no_grad():
        return model.getModel()(features).numpy()


def test_regression_and_binary_predict_the_modules_own_output_and_validate(spark) -> None:
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import VectorAssembler

    frame = _frame(spark)
    assembler = VectorAssembler(inputCols=COLUMNS, outputCol="features")
    sink = Sink()
    regression = TorchEstimator(torch.nn.Linear(4, 1), torch.nn.MSELoss(), input_shape=(4,),
                                label_col="value", epochs=3, learning_rate=0.05, seed=0,
                                training_master=_master(), validation=0.2, loggers=[sink])
    model = Pipeline(stages=[assembler, regression]).fit(frame)
    scored = model.transform(frame)
    assert "probability" not in scored.columns  # a value, no probability
    rows = scored.orderBy("id").collect()
    predictions = np.array([r["prediction"] for r in rows])
    torch_model = model.stages[-1]
    np.testing.assert_allclose(predictions, _module_output(torch_model, rows)[:, 0], rtol=1e-5, atol=1e-6)
    assert np.std(predictions) > 0.5  # the fit's answer per row, not one constant
    history = torch_model.history
    assert [h["epoch"] for h in history] == [1, 2, 3]
    assert all({"loss", "val_loss", "val_mse", "val_r2"} <= set(h) for h in history)
    assert history[-1]["val_mse"] < history[0]["val_mse"]
    # MSELoss over one output is the mean squared error: the loss and the metric of the same rows agree
    assert [h["val_loss"] for h in history] == pytest.approx([h["val_mse"] for h in history], rel=1e-4)
    logged = [(epoch, m) for _, epoch, m in sink.calls if "validation/mse" in m]
    assert [epoch for epoch, _ in logged] == [1, 2, 3]
    assert [m["validation/mse"] for _, m in logged] == pytest.approx([h["val_mse"] for h in history])

    sink = Sink()
    module = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    binary = TorchEstimator(module, torch.nn.BCEWithLogitsLoss(), input_shape=(4,), epochs=2,
                            learning_rate=0.05, seed=0, training_master=_master(), validation="is_val",
                            loggers=sink)
    model = Pipeline(stages=[assembler, binary]).fit(frame)
    rows = model.transform(frame).orderBy("id").collect()
    p = 1.0 / (1.0 + np.exp(-_module_output(model.stages[-1], rows)[:, 0]))
    predictions = np.array([r["prediction"] for r in rows])
    np.testing.assert_array_equal(predictions, (p >= 0.5).astype(float))
    assert set(predictions) == {0.0, 1.0}
    probabilities = np.array([r["probability"].toArray() for r in rows])
    np.testing.assert_allclose(probabilities, np.stack([1 - p, p], axis=1), rtol=1e-5, atol=1e-6)
    labels = np.array([r["label"] for r in rows])
    assert np.mean(predictions == labels) > 0.8
    history = model.stages[-1].history
    assert [h["epoch"] for h in history] == [1, 2] and all("val_accuracy" in h for h in history)
    held_out = [r for r in rows if r["is_val"]]  # the column's rows, scored by the final model
    accuracy = np.mean([r["prediction"] == r["label"] for r in held_out])
    assert history[-1]["val_accuracy"] == pytest.approx(accuracy)
    assert [m["validation/accuracy"] for _, _, m in sink.calls if "validation/accuracy" in m] == \
        pytest.approx([h["val_accuracy"] for h in history])
    # macro precision/recall/F1 as scikit-learn counts them, and the module's own loss, on the same rows
    from sklearn.metrics import f1_score, precision_score, recall_score

    y, predicted = [r["label"] for r in held_out], [r["prediction"] for r in held_out]
    for name, reference in (("precision", precision_score), ("recall", recall_score), ("f1", f1_score)):
        expected = reference(y, predicted, average="macro", labels=[0, 1], zero_division=0)
        assert history[-1][f"val_{name}"] == pytest.approx(expected), name
    logits = torch.tensor(_module_output(model.stages[-1], held_out)[:, 0])
    bce = torch.nn.BCEWithLogitsLoss()(logits, torch.tensor(y, dtype=torch.float32))
    assert history[-1]["val_loss"] == pytest.approx(float(bce), rel=1e-4)
    logged = {epoch: m for _, epoch, m in sink.calls if "validation/f1" in m}
    assert sorted(logged) == [1, 2] and logged[2]["validation/loss"] == pytest.approx(history[-1]["val_loss"])


def test_labels_and_outputs_the_loss_cannot_take_are_refused_before_training(spark, monkeypatch) -> None:
    def no_training(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(ml_estimator, "SparkNetwork", no_training)
    base = _frame(spark, rows=40).selectExpr("id", "array(x0, x1, x2, x3) AS features", "label")

    def estimator(**kwargs) -> TorchEstimator:
        return TorchEstimator(torch.nn.Linear(4, 3), torch.nn.CrossEntropyLoss(), input_shape=(4,), **kwargs)

    for bad in (0.5, -1.0):
        frame = base.selectExpr("id", "features", f"IF(id = 7, {bad}D, CAST(label AS DOUBLE)) AS label")
        with pytest.raises(SparkInputError) as caught:
            estimator().fit(frame.orderBy("id"))
        message = str(caught.value)
        assert "'label'" in message and repr(bad) in message and "row 7 " in message
        assert "Parquet" not in message
    text = base.selectExpr("features", "IF(label = 1, 'yes', 'no') AS label")
    with pytest.raises(SparkInputError, match="'label'.*strings.*StringIndexer"):
        estimator().fit(text)
    with pytest.raises(SparkInputError, match="'label' of the validation DataFrame.*0.5"):
        estimator(validation=base.selectExpr("features", "0.5D AS label")).fit(base)
    with pytest.raises(ConfigError, match="one output column"):  # a softmax argmax over one output
        TorchEstimator(torch.nn.Linear(4, 1), torch.nn.CrossEntropyLoss(), input_shape=(4,)).fit(base)


def test_cross_validator_over_epochs_and_learning_rate(spark) -> None:
    from pyspark.ml.evaluation import RegressionEvaluator
    from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

    frame = _frame(spark, rows=240).selectExpr("id", "array(x0, x1, x2, x3) AS features", "value")
    estimator = TorchEstimator(torch.nn.Linear(4, 1), torch.nn.MSELoss(), input_shape=(4,), label_col="value",
                               seed=0, training_master=_master())
    grid = (ParamGridBuilder().addGrid(estimator.epochs, [1, 2])
            .addGrid(estimator.learningRate, [1e-4, 0.05]).build())
    evaluator = RegressionEvaluator(labelCol="value", predictionCol="prediction", metricName="rmse")
    cv = CrossValidator(estimator=estimator, estimatorParamMaps=grid, evaluator=evaluator, numFolds=2, seed=1)
    fitted = cv.fit(frame)
    assert len(fitted.avgMetrics) == 4 and all(np.isfinite(fitted.avgMetrics))
    best = int(np.argmin(fitted.avgMetrics))
    assert grid[best][estimator.learningRate] == 0.05  # the rate that moves at all in 1-2 epochs
    assert isinstance(fitted.bestModel, TorchModel)
    assert len(fitted.bestModel.history) == grid[best][estimator.epochs]
    assert estimator.getEpochs() == 1 and not estimator.isSet("learningRate")  # the grid changed copies only


def test_network_estimator_with_a_param_map_and_train_validation_split(spark, tmp_path) -> None:
    """A psrv.nn Network through NetworkEstimator: its Params, ``fit(df, paramMap)`` (the map wins over
    the estimator's values, which stay), ``resume`` of a run by its id, and TrainValidationSplit over a
    small grid of learning rates."""
    from psrv.nn import Dense, Network, Output, Sgd
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.tuning import ParamGridBuilder, TrainValidationSplit

    network = Network([Dense(8, activation="relu"), Output(2)], input_shape=(4,), updater=Sgd(0.1), seed=2)
    estimator = NetworkEstimator(network, seed=0, training_master=_master())
    assert estimator.getEpochs() == 1 and "learningRate" in estimator.explainParams()
    frame = _frame(spark, rows=240).selectExpr("id", "array(x0, x1, x2, x3) AS features", "label")
    run = {estimator.checkpointDir: str(tmp_path), estimator.runId: "first"}
    model = estimator.fit(frame, {estimator.learningRate: 0.2, estimator.predictionCol: "guess", **run})
    assert isinstance(model, TorchModel) and len(model.history) == 1
    assert estimator.getOrDefault("predictionCol") == "prediction" and not estimator.isSet("learningRate")
    rows = model.transform(frame).orderBy("id").collect()
    features = np.array([r["features"] for r in rows], dtype=np.float32)
    expected = model.network.output(features).argmax(axis=1)  # the trained network's own answer
    np.testing.assert_array_equal([r["guess"] for r in rows], expected)
    resumed = estimator.fit(frame, {estimator.epochs: 2, estimator.resume: True, **run})  # epoch 2 only
    assert [h["epoch"] for h in resumed.history] == [1, 2]
    assert resumed.history[0]["loss"] == pytest.approx(model.history[0]["loss"])  # from the checkpoint
    assert sorted(p.name for p in (tmp_path / "first").glob("checkpoint-*")) == \
        ["checkpoint-000001.psrvckpt", "checkpoint-000002.psrvckpt"]

    grid = ParamGridBuilder().addGrid(estimator.learningRate, [1e-4, 0.2]).build()
    evaluator = MulticlassClassificationEvaluator(labelCol="label", predictionCol="prediction",
                                                  metricName="accuracy")
    split = TrainValidationSplit(estimator=estimator, estimatorParamMaps=grid, evaluator=evaluator,
                                 trainRatio=0.75, seed=1)
    fitted = split.fit(frame)
    assert len(fitted.validationMetrics) == 2 and all(0.0 <= m <= 1.0 for m in fitted.validationMetrics)
    best = int(np.argmax(fitted.validationMetrics))
    assert isinstance(fitted.bestModel, TorchModel)
    rate = fitted.bestModel.network.updater.schedule.value_at(0, 0)  # the grid's rate reached the network
    assert rate == pytest.approx(grid[best][estimator.learningRate])


def test_unfitted_pipeline_with_the_estimator_saves_and_loads(spark, tmp_path) -> None:
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import VectorAssembler

    module = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    estimator = TorchEstimator(module, torch.nn.CrossEntropyLoss(),
                               optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.5),
                               input_shape=(4,), epochs=3, batch_size=64, validation=0.25,
                               learning_rate=0.02, seed=5, training_master=_master())
    pipeline = Pipeline(stages=[VectorAssembler(inputCols=COLUMNS, outputCol="features"), estimator])
    path = "file://" + str(tmp_path / "unfitted pipeline")
    pipeline.save(path)
    loaded = Pipeline.load(path).getStages()[-1]
    assert type(loaded) is TorchEstimator and loaded.uid == estimator.uid
    assert {p.name: loaded.getOrDefault(p) for p in loaded.params if loaded.isDefined(p)} == \
        {p.name: estimator.getOrDefault(p) for p in estimator.params if estimator.isDefined(p)}
    for mine, theirs in zip(module.state_dict().values(), loaded.module.state_dict().values(), strict=True):
        assert torch.equal(mine, theirs)
    optimizer = loaded.optimizer(torch.nn.Linear(2, 2).parameters())  # the factory, by value
    assert isinstance(optimizer, torch.optim.SGD) and optimizer.defaults["momentum"] == 0.5
    assert isinstance(loaded.training_master, ParameterAveragingTrainingMaster)
    # string labels indexed by an earlier stage: the validation fraction is split inside fit, after the
    # StringIndexer, so validation rows carry the same label order as the training rows
    from pyspark.ml.feature import StringIndexer
    from pyspark.sql import functions as F

    frame = _frame(spark, rows=200)
    frame = frame.withColumn("answer", F.when(F.col("label") == 1, "yes").otherwise("no")).drop("label")
    fast = loaded.copy({loaded.learningRate: 0.3})  # learns in 3 epochs of 200 rows
    model = Pipeline(stages=[StringIndexer(inputCol="answer", outputCol="label"),
                             VectorAssembler(inputCols=COLUMNS, outputCol="features"), fast]).fit(frame)
    history = model.stages[-1].history
    assert len(history) == 3 and "val_accuracy" in history[-1]
    rows = model.transform(frame).select("label", "prediction").collect()
    accuracy = float(np.mean([r["label"] == r["prediction"] for r in rows]))
    assert accuracy > 0.6, accuracy  # it learned: the labels are balanced
    assert abs(history[-1]["val_accuracy"] - accuracy) < 0.2, (history, accuracy)
