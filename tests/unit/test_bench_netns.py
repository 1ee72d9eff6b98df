"""scripts/bench_netns.py's own logic, without namespaces: the link's rate and bucket, the models it
builds, and the clear refusals before anything is built."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import bench_local  # noqa: E402
import bench_netns  # noqa: E402


def test_rates_in_bits_and_a_bucket_of_4_ms_at_least_32_kbit() -> None:
    assert bench_netns.rate_bits("1gbit") == 10**9
    assert bench_netns.rate_bits("100mbit") == 10**8
    assert bench_netns.rate_bits("2.5Gbit") == 25 * 10**8
    assert bench_netns.burst_for("1gbit") == "4000kbit"  # 4 ms at 1 Gbit/s
    assert bench_netns.burst_for("1mbit") == "32kbit"
    with pytest.raises(ValueError, match="1gbit, 100mbit"):
        bench_netns.rate_bits("1 GB/s")


def test_sizes_build_the_step_cost_benchmarks_mlps() -> None:
    def count(hidden: tuple[int, ...]) -> int:
        return sum(p.numel() for p in bench_local.make_model(hidden).parameters())

    assert count(bench_netns.SIZES["11m"]) == 11_019_018
    assert count(bench_netns.SIZES["1m"]) == count(bench_local.HIDDEN) == 1_058_058
    default, again = bench_local.make_model(), bench_local.make_model(bench_local.HIDDEN)
    assert all(a.equal(b) for a, b in zip(default.parameters(), again.parameters(), strict=True))


def test_a_bad_rate_or_no_namespaces_stop_it_with_2_before_anything_is_built(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    built: list[object] = []
    monkeypatch.setattr(bench_netns, "Hosts", lambda *a, **k: built.append(a))
    with pytest.raises(SystemExit) as exc:
        bench_netns.main(["--rate", "fast"])
    assert exc.value.code == 2 and "expected a tc rate" in capsys.readouterr().err
    monkeypatch.setattr(bench_netns, "unavailable_reason", lambda: "network namespaces need root")
    assert bench_netns.main(["--size", "1m"]) == 2
    err = capsys.readouterr().err
    assert "need root" in err and "Run the script as root" in err
    assert built == []
