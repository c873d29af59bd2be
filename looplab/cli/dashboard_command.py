"""`looplab dashboard`: MLflow's dashboard of a sweep's store, served until Ctrl-C
(looplab/dashboard_server.py)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from looplab.arguments import flag, flags_of, int_in, number_in
from looplab.cli.shared_flags import command


@dataclass(frozen=True)
class Dashboard:
    """serve MLflow's dashboard of a sweep's store until Ctrl-C, print its URLs
    (looplab/dashboard_server.py)

    `looplab dashboard`'s arguments: STORE and its flags."""

    store: str = flag(help="a sweep's storage folder (holding mlflow.db) or sqlite:///PATH", argument=True)
    port: int = flag(5000, "default 5000, the port a sweep's URLs name", type=int_in(1, 65535))
    host: str = flag("127.0.0.1", "the interface to bind (default 127.0.0.1: this machine only)")
    experiment: str | None = flag(None, "the experiment whose newest sweep to open (default: the store's newest sweep)")
    timeout: float = flag(180.0, "seconds to wait for the server's /health (default 180)", type=number_in(1))


def add_dashboard(sub) -> None:
    command(sub, "dashboard", cmd_dashboard, Dashboard)


def _wait_interruptibly(process) -> int:
    """The process's exit status. Not a bare wait(): a signal that lands on another thread
    (MLflow's client starts some) runs its Python handler only once the main thread runs
    Python again, and a blocking waitpid would never return to it."""
    import subprocess

    while True:
        try:
            return process.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass


def cmd_dashboard(parsed: argparse.Namespace) -> int:
    """Serve the store with one MLflow worker in a process group of its own, print the
    URLs once /health answers, then wait; Ctrl-C or SIGTERM stops the whole group."""
    import signal

    from looplab import dashboard_server as ds

    args = flags_of(Dashboard, parsed)
    uri = ds.store_uri(args.store)

    # SIGINT too: a shell starts a background job with SIGINT ignored, and Python then
    # leaves it ignored; a kill -INT must still stop the server, not orphan it.
    stop_asked = ds.stop_once()
    handlers = {s: signal.signal(s, stop_asked) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    server = ds.Server(uri, args.host, args.port)
    try:
        with server:
            lines = ds.sweep_lines(uri, server.base, args.experiment)  # reads the store while the server starts
            took = server.wait_healthy(args.timeout)
            print(
                f"serving {uri} at {server.base}/ (up in {took:.0f} s; process group {server.pgid}; log: {server.log})"
            )
            print("\n".join(lines))
            print("Ctrl-C stops it.", flush=True)
            status = _wait_interruptibly(server.process)
        print(f"looplab: mlflow server exited by itself (status {status}); its log: {server.log}", file=sys.stderr)
        return 1
    except ds.NotServing as e:
        print(f"looplab: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        forced = f" ({server.killed} ignored SIGTERM and were killed)" if server.killed else ""
        left = ds.group_members(server.pgid) if server.pgid else []
        if left:
            print(f"looplab: MLflow processes {left} of process group {server.pgid} are still running", file=sys.stderr)
            return 1
        print(f"stopped: no MLflow process left{forced}", flush=True)
        return 0
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
