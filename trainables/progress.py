"""Live progress of a sweep: trials post short records to a board the driver reads.

A trial's process (or rank 0 of its worker group) posts a record at each stage
boundary, every PROGRESS_SECONDS of training, and when the trial ends; the sweep's
driver drains the board every second or two and prints one line per record, so a
researcher can tell a slow sweep from a hung one. The board is a named Ray actor
(one per sweep invocation), so it works wherever the trials run (another node, local
mode or worker actors) without shared storage. Posting is fire-and-forget: a missing
board (a driver that died) never fails a trial.

The board also carries the driver's one message the other way: a stop request (the
user pressed Ctrl-C or sent SIGTERM, sweeps/stop.py). Trials ask it between steps
(Reporter.stop_requested, at most every STOP_POLL_SECONDS), checkpoint and end.

Records: {"trial": label, "event": "start" | "step" | "end" | "stopped" | "reused" | "resumed_done" |
"resumed" | "restarted" | "worker_died" | "retrain" | "trial_stale" | "trial_end" | "eval" | "eval_failed" | "speed", "stage", "step", "steps", "loss", "tokens_per_s", "eta_s", "summary", "policy",
"task", "error", "line", "why"}; evaluation jobs (trainables/evaluation.py) post eval and eval_failed,
speed jobs (trainables/bench.py) a speed record with its line per measured point.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable

from looplab.tracking import TOKENS_PER_S

PROGRESS_SECONDS = 10.0  # a trial posts at least this often while it trains (the issue asks <= 30 s)
STOP_POLL_SECONDS = 1.0  # a training trial asks the board whether to stop at most this often
NAMESPACE = "looplab"


def board_name(sweep_run_name: str) -> str:
    return f"looplab-progress-{sweep_run_name}"


def _board_class():
    import ray

    @ray.remote(num_cpus=0)
    class ProgressBoard:
        """Holds posted records until the driver drains them."""

        def __init__(self):
            self.records: list[dict[str, Any]] = []
            self.stop: str | None = None

        def request_stop(self, reason: str) -> None:
            self.stop = self.stop or reason

        def stop_reason(self) -> str | None:
            return self.stop

        def post(self, record: dict[str, Any]) -> None:
            self.records.append(record)

        def drain(self) -> list[dict[str, Any]]:
            out, self.records = self.records, []
            return out

    return ProgressBoard


class Reporter:
    """What a trial uses to post its progress; a no-op without a board."""

    def __init__(self, board: str | None, trial: str, min_seconds: float = PROGRESS_SECONDS):
        self.trial, self.min_seconds = trial, min_seconds
        self._handle = None
        self._last = -float("inf")
        self._stop: str | None = None
        self._asked = -float("inf")
        if board:
            try:
                import ray

                self._handle = ray.get_actor(board, namespace=NAMESPACE)
            except Exception:  # noqa: BLE001 - no board (e.g. a resumed sweep's new driver): no progress
                self._handle = None

    def post(self, event: str, wait: bool = False, **fields: Any) -> None:
        """wait: until the board holds the record, so that the driver, once this task has
        returned, prints it before its own line about the task."""
        if self._handle is not None:
            try:
                ref: Any = self._handle.post.remote(
                    {"trial": self.trial, "event": event, "time": time.time(), **fields}
                )
                if wait:
                    import ray

                    ray.get(ref, timeout=30)
            except Exception:  # noqa: BLE001 - progress must never fail a trial
                self._handle = None

    def stop_requested(self) -> str | None:
        """Why the driver asked the sweep to stop (e.g. "SIGINT"), or None: asked of the
        board at most every STOP_POLL_SECONDS; a request, once seen, stands."""
        if self._stop is not None or self._handle is None:
            return self._stop
        now = time.monotonic()
        if now - self._asked >= STOP_POLL_SECONDS:
            self._asked = now
            try:
                import ray

                reason: Any = ray.get(self._handle.stop_reason.remote(), timeout=10)
                self._stop = reason
            except Exception:  # noqa: BLE001 - a board that is gone cannot ask for a stop
                pass
        return self._stop

    def training(self, stage: str) -> Callable[[dict[str, Any]], None]:
        """A train(on_progress=...) callback that posts at most every min_seconds."""

        def on_progress(state: dict[str, Any]) -> None:
            now = time.monotonic()
            if now - self._last >= self.min_seconds or state["step"] == state["steps"]:
                self._last = now
                self.post("step", stage=stage, **state)

        return on_progress


def _summary(r: dict[str, Any]) -> str:
    summary = "  ".join(f"{k} {v:.4g}" for k, v in (r.get("summary") or {}).items())
    return f": {summary}" if summary else ""


# What each event's line says after the trial's label, one entry per event.
_LINES: dict[str, Callable[[dict[str, Any]], str]] = {
    "start": lambda r: f"{r['stage']}: training {r['steps']} steps" + (f", {r['threads']}" if r.get("threads") else ""),
    "reused": lambda r: f"{r['stage']}: reused (trained by another trial)",
    # its done marker vouched for files that are missing or damaged (trainables/keyed_step.py)
    "retrain": lambda r: f"{r['stage']}: {r['why']} → retrain",
    "trial_stale": lambda r: f"trial finished before, but {r['why']} → run again",
    "resumed_done": lambda r: f"{r['stage']}: already trained by this trial before its restart",
    # the stage starts from the checkpoint an earlier attempt saved, not from step 1
    "resumed": lambda r: f"{r['stage']}: resumes after step {r['step']}/{r['steps']}, its last checkpoint",
    # Ray Tune restarts the trial after a failure (trial_watch in sweeps/launch.py)
    "restarted": lambda r: f"restarted by Ray (attempt {r['attempt']}) after: {r['error']}",
    # Ray Train restarts a stage's worker group after one of them died (trainables/worker_watch.py)
    "worker_died": lambda r: f"{r['stage']}: worker {r['rank']} died ({r['error']}); {r['then']}",
    "end": lambda r: f"{r['stage']}: done in {_clock(r.get('seconds', 0))}",
    "stopped": lambda r: f"{r['stage']}: stopped at step {r['step']}/{r['steps']}, checkpoint saved",
    "step": lambda r: (
        f"{r['stage']}  step {r['step']}/{r['steps']}  loss {r['loss']:.4f}  "
        f"{r[TOKENS_PER_S]:,.0f} tok/s  eta {_clock(r['eta_s'])}"
    ),
    # a downstream evaluation (trainables/evaluation.py) finished, or failed
    "eval": lambda r: f"{r['policy']} {r['task']}" + _summary(r),
    "eval_failed": lambda r: f"{r['policy']} {r['task']}: FAILED {r.get('error', '')}",
    "speed": lambda r: r["line"],  # a timed point (trainables/bench.py) was measured
    "trial_end": lambda r: f"trial {r.get('status', 'done')}" + _summary(r),
}


def format_record(r: dict[str, Any]) -> str:
    """One line per record, e.g.
    [beta=0.1 seed=0] stage1  step 12/40  loss 2.0341  1,234 tok/s  eta 0:00:21"""
    line = _LINES.get(r["event"])
    return f"[{r['trial']}] {line(r) if line else r['event']}"


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Printer:
    """The driver's side: creates the board and prints what trials post, from a
    background thread, until stopped."""

    def __init__(self, board: str, out=None, interval: float = 1.5):
        self.board, self.interval = board, interval
        self.out = out or sys.stderr
        self._handle = _board_class().options(name=board, namespace=NAMESPACE, get_if_exists=True).remote()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="looplab-progress", daemon=True)

    def __enter__(self) -> "Printer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._print_pending()  # the last trials' final lines

    def request_stop(self, reason: str) -> None:
        """Ask every trial to stop (fire and forget: called from a signal handler)."""
        self._handle.request_stop.remote(reason)

    def flush(self) -> None:
        """Print what is posted now (e.g. a finished job's lines before the driver's own)."""
        self._print_pending()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._print_pending()

    def _print_pending(self) -> None:
        import ray

        try:
            records = ray.get(self._handle.drain.remote(), timeout=30)
        except Exception:  # noqa: BLE001 - a board that died takes the progress with it, not the sweep
            return
        for record in sorted(records, key=lambda r: r.get("time", 0.0)):
            print(format_record(record), file=self.out, flush=True)
