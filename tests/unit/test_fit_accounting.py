"""A fit's accounting: ``updates_missing`` is exactly what the finished tasks submitted minus what the
master applied of theirs, under every id their nodes held (a node that rejoined re-sends under its
old id), with a failed attempt's updates counted apart."""

from __future__ import annotations

from types import SimpleNamespace

from psrv.spark.driver.shared_training import _accounting


def _result(partition: int, node_ids: list[int], attempt: int = 0) -> SimpleNamespace:
    return SimpleNamespace(partition=partition, attempt=attempt, counters={"node_ids": node_ids})


def test_updates_missing_is_submitted_minus_applied_under_every_id_held() -> None:
    results = [_result(0, [1, 4]), _result(1, [2])]  # partition 0 rejoined: ids 1 then 4
    counters = {"applied_by_origin": {1: 300, 4: 200, 2: 490, 3: 7},  # 3: a failed attempt
                "member_names": {1: "j-p0", 2: "j-p1", 3: "j-p0", 4: "j-p0"}}
    out = _accounting("j", results, 1000, counters)
    assert out == {"mesh_members": 4,  # the ids the controller admitted for the job, a rejoin's included
                   "updates_missing": 10, "updates_applied_by_failed_attempts": 7, "retried_partitions": [0]}
    assert _accounting("j", results, 990, counters)["updates_missing"] == 0
    # more applied than submitted is a double application: shown, not hidden as 0
    assert _accounting("j", results, 980, counters)["updates_missing"] == -10
