"""The HTML report from the stats a real parameter-averaging fit on Spark records."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from psrv.nn import Dense, Network, Output, Sgd
from psrv.nn.data import DataSet
from psrv.spark import ParameterAveragingTrainingMaster, SparkNetwork
from psrv.spark.observe.report import CLOCK_CAVEAT, export_stats_html

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]


class _Rows(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.rows: list[str] = []
        self.charts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "g" and found.get("class") == "timeline-row":
            self.rows.append(str(found["data-worker"]))
        if tag == "svg" and found.get("class") == "chart":
            self.charts.append(str(found["data-metric"]))


def test_report_of_a_real_fit_has_a_row_per_worker(spark_context, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    data = DataSet.from_class_indices(
        rng.standard_normal((160, 4)).astype(np.float32), rng.integers(0, 2, 160), 2
    )
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=16,
        averaging_frequency=2,
        collect_training_stats=True,
        rdd_training_approach="direct",
    )
    net = Network([Dense(8, activation="relu"), Output(2)], input_shape=(4,), updater=Sgd(0.1), seed=1)
    spark_net = SparkNetwork(spark_context, net, master)
    spark_net.fit(spark_context.parallelize(list(data.batches(20)), 2))
    stats = spark_net.get_training_stats()
    workers = {str(s["worker"]) for s in stats}
    assert len(workers) >= 2  # at least one executor worker plus the driver

    path = export_stats_html(stats, str(tmp_path / "report.html"))
    text = Path(path).read_text(encoding="utf-8")
    parser = _Rows()
    parser.feed(text)
    assert sorted(parser.rows) == sorted(workers)
    assert "loss" in parser.charts
    assert CLOCK_CAVEAT in text
