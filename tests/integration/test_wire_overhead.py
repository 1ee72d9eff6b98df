"""The wire-overhead benchmark measures what a real node sends: its figures add up against the
payloads it encoded and the model's dense size, and bad arguments are refused by name."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from psrv.encoding import shared_training_threshold

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import bench_wire_overhead  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def test_an_update_costs_its_payload_plus_a_bounded_header_on_the_wire() -> None:
    small = bench_wire_overhead.measure(800, 0.03, 40, 0.002)
    large = bench_wire_overhead.measure(200_000, 0.03, 40, 0.002)
    for run, params in ((small, 800), (large, 200_000)):
        assert run["params"] == params
        # the payload is the packed message: a 16-byte header and about a byte per element sent, 3 % of
        # them or, on the small model, as many as the default's byte budget lets into 1 % of its dense bytes
        elements = min(math.ceil(0.03 * params), shared_training_threshold().budget_elements(params))
        assert (elements < 0.03 * params) == (params == 800)
        assert 16 + elements * 0.8 <= run["payload"] <= 16 + elements * 2 + 8
        assert run["payload_ratio"] == pytest.approx(run["payload"] / (4 * params))
        assert run["wire_ratio"] == pytest.approx(run["wire"] / (4 * params))
        assert 0 <= run["heartbeats"] < run["wire"]
        assert run["updates_ratio"] == pytest.approx((run["wire"] - run["heartbeats"]) / (4 * params))
        # a lone update travels as one compact frame: the payload less its 16-byte header, and at least
        # 12 bytes of fields (tag and version, src, seq, iteration, epoch, count, N, τ); heartbeats on top
        assert run["payload"] - 4 <= run["wire"] <= run["payload"] + 400
    assert small["payload_ratio"] <= 0.01  # the budget holds in what was sent
    # what comes beside the payload weighs on a small model, hardly on a large one; less the heartbeats,
    # a small model's updates take no more on the wire than their payloads with their 16-byte headers
    assert large["wire_ratio"] < 1.05 * large["payload_ratio"]
    assert small["updates_ratio"] <= small["payload_ratio"]


def test_the_benchmark_prints_one_row_per_model_size(capsys) -> None:
    bench_wire_overhead.main(["--params", "788,5000", "--updates", "20", "--repeats", "1", "--gap-ms", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| model | parameters |")
    assert [row.split(" | ")[:2] for row in rows[1:]] == [["| seq", "788"], ["| -", "5,000"]]


@pytest.mark.parametrize("args, says", [
    (["--params", "8"], "--params: expected model sizes of at least 16"),
    (["--params", "1e4"], "--params: expected model sizes of at least 16"),
    (["--sparsity", "0.5"], "--sparsity: expected a fraction in (0, 0.25)"),
    (["--updates", "0"], "--updates and --repeats must be >= 1"),
])
def test_bad_arguments_are_refused_by_name(args, says) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_wire_overhead.py"), *args],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and says in done.stderr
