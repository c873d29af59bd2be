"""What Ray Train does to a stage's workers that the console must hear of.

When a worker of a stage's group dies (a killed process, an out-of-memory kill, an
exception), Ray Train restarts the whole group up to its FailureConfig's count,
silently: the error is only in ray.log, and the trial never fails in Tune's eyes,
so the sweep's own watch (sweeps/trial_watch.py) does not see it. `worker_watch`
is a Ray Train callback, run in the stage's Train controller, that says each such
failure in one progress line (the stage, the rank, the error's first line, the
attempt); the restarted group then says where it resumes (trainables/stage_worker.py).
"""

from __future__ import annotations

from typing import Any


def cause_line(text: str) -> str:
    """The line of an error's text that says what happened: the last unindented one (a
    traceback's "RuntimeError: boom"; Ray leads a remote error with its own wrapper
    lines and indents the details)."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith((" ", "\t"))]
    return (lines[-1] if lines else "unknown error")[:300]


def first_line(error: BaseException) -> str:
    """What killed a worker: a failed health check (a dead worker process) says it in
    the failure it carries; anything else in its own text."""
    cause = getattr(error, "health_check_failure", None) or error
    line = cause_line(str(cause))
    if len(line) > 160 and ". " in line[20:]:  # Ray's death notices run on for sentences
        line = line[: line.index(". ", 20) + 1]
    named = ":" in line.split(" ", 1)[0]  # a traceback's own "RuntimeError: boom"
    return line if named else f"{type(cause).__name__}: {line}"


def death_line(rank: int, error: BaseException, attempt: int, retries: int) -> dict[str, Any]:
    """The progress record of one failure of a stage's worker group."""
    then = f"Ray Train restarts its workers (retry {attempt} of {retries})" if attempt <= retries else "no retry left"
    return {"rank": rank, "error": first_line(error), "then": then}


def worker_watch(board: str, label: str, stage: str, retries: int):
    """A Ray Train callback that posts to the sweep's progress board (named `board`)
    under the trial's label. It counts the group's failures itself: the controller that
    runs it lives as long as the stage's fit."""
    from ray.train import UserCallback

    from trainables.progress import Reporter

    class WorkerWatch(UserCallback):
        def __init__(self) -> None:
            self.failures = 0

        def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
            self.failures += 1
            rank = min(worker_exceptions)  # one line per failure: the lowest failed rank speaks for it
            record = death_line(rank, worker_exceptions[rank], self.failures, retries)
            # The board is found here, in the controller, not carried from the trial
            Reporter(board, label).post("worker_died", wait=True, stage=stage, **record)

    return WorkerWatch()
