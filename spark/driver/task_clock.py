"""When the tasks of a Spark job really started, as seen from the driver (Spark's status tracker).

A job may wait for executors, or for earlier stages (a shuffle, a slow source), long before its
training tasks run; a deadline for what those tasks do (join the controller) counts from their start,
not from the job's submission.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark import SparkContext


class TaskStartClock:
    """The driver's monotonic time at which a task of the final stage of ``group``'s job was first seen
    running (or finished), or None while none has started."""

    def __init__(self, spark_context: SparkContext, group: str) -> None:
        self.spark_context = spark_context
        self.group = group
        self._started: float | None = None

    def started(self) -> float | None:
        if self._started is None and self._final_stage_running():
            self._started = time.monotonic()
        return self._started

    def _final_stage_running(self) -> bool:
        try:
            tracker = self.spark_context.statusTracker()
            for job_id in tracker.getJobIdsForGroup(self.group):
                job = tracker.getJobInfo(job_id)
                if job is None or not job.stageIds:
                    continue
                stage = tracker.getStageInfo(max(job.stageIds))  # the result stage: the highest id
                if stage is not None and stage.numActiveTasks + stage.numCompletedTasks \
                        + stage.numFailedTasks > 0:
                    return True
        except Exception:  # noqa: BLE001 - a stopping context: the caller's other checks decide
            return False
        return False


__all__ = ["TaskStartClock"]
