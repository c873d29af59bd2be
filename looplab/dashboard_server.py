"""`looplab dashboard STORE`: MLflow's dashboard over a sweep's local store, served until
Ctrl-C, with nothing left behind.

Why not the bare `mlflow server --backend-store-uri ...`: on a loaded small machine its
default of 4 uvicorn workers keep dying and restarting, and the port answers late or not
at all (docs/dashboard.md has the figures); one worker serves. It also starts a job runner and Huey consumers (GenAI jobs and
periodic tasks a dashboard of training runs never uses; MLFLOW_SERVER_ENABLE_JOB_EXECUTION
turns them off), and on SIGTERM it left stuck workers and orphaned those background
processes. So the server here runs one worker, no job runner, in a process group of its
own; stopping it signals the whole group (TERM, then KILL after a grace period) and
waits until no process of the group is left.

No MLflow import at module top: the server is the `mlflow` CLI in a subprocess, and only
finding the sweep's URLs reads the store (looplab/tracking/mlflow_runs.py's client).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import urlparse

from looplab import dashboard, destinations, tracking
from looplab.errors import invalid

START_TIMEOUT_S = 180.0  # one worker answers in ~9 s on a quiet machine; a loaded one is slower
STOP_GRACE_S = 10.0  # after SIGTERM, before SIGKILL
STORE_HELP = "a sweep's storage folder holding mlflow.db, or sqlite:///PATH/mlflow.db"
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
CREDENTIALS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")  # what MLflow's client sends


class NotServing(RuntimeError):
    """The server exited or never answered /health: one line, with where its log is."""


def store_uri(store: str) -> str:
    """The tracking URI of STORE: a storage folder (its mlflow.db), an SQLite file, or a
    sqlite:/// or database URI of an existing store. A bad one is a one-line ConfigError."""
    scheme = urlparse(store).scheme
    if scheme in ("http", "https"):
        raise invalid("STORE", store, f"{STORE_HELP} (a tracking server serves its own dashboard: open its URL)")
    if "://" in store:
        destinations.existing_store("STORE", store)
        return store
    path = Path(store).expanduser()
    if path.is_dir() and (path / dashboard.STORE_FILE).is_file():
        destinations.intact_sqlite("STORE", store, path / dashboard.STORE_FILE)
        return f"sqlite:///{(path / dashboard.STORE_FILE).as_posix()}"
    if path.is_file() and path.suffix == ".db":
        destinations.intact_sqlite("STORE", store, path)
        return f"sqlite:///{path.as_posix()}"
    found = "a folder without mlflow.db" if path.is_dir() else "no such file or folder"
    raise invalid("STORE", store, f"{STORE_HELP} ({found})")


def is_loopback(host: str) -> bool:
    return host.startswith("127.") or host in ("localhost", "::1")


def needs_auth(host: str, environ: dict[str, str] | None = None) -> bool:
    """Whether serving on `host` takes MLflow's basic auth, by scripts/mlflow_server.sh's
    rule: loopback serves as is; a wildcard never (it serves every interface, the public
    one included, and MLflow then answers anyone who sends a loopback Host header);
    any other address only with MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD
    set (the pair a client sends). A refused host is a one-line ConfigError."""
    env = os.environ if environ is None else environ
    if is_loopback(host):
        return False
    if host in WILDCARD_HOSTS or host == "*":
        raise invalid(
            "--host",
            host,
            "127.0.0.1 (this machine; an SSH tunnel reaches it from another), or this node's own address "
            "with basic auth (a wildcard serves every interface, the public one included)",
        )
    if not all(env.get(name) for name in CREDENTIALS):
        raise invalid(
            "--host",
            host,
            f"127.0.0.1, or {host} with {' and '.join(CREDENTIALS)} set: it is reachable from other "
            "machines, so the dashboard asks for them (scripts/mlflow_server.sh credentials writes a pair)",
        )
    import importlib.util

    if importlib.util.find_spec("flask_wtf") is None:  # MLflow's basic-auth app needs it (its auth extra)
        raise invalid(
            "--host", host, f"127.0.0.1, or {host} once MLflow's basic auth is installed: pip install 'mlflow[auth]'"
        )
    return True


def server_argv(uri: str, host: str, port: int, auth: bool = False) -> list[str]:
    """The `mlflow server` invocation: one worker (see the module docstring), with MLflow's
    basic-auth app where `auth`."""
    mlflow = shutil.which("mlflow")
    head = [mlflow] if mlflow else [sys.executable, "-m", "mlflow"]
    argv = [*head, "server", "--backend-store-uri", uri, "--host", host, "--port", str(port), "--workers", "1"]
    return [*argv, "--app-name", "basic-auth"] if auth else argv


def server_env(
    host: str = dashboard.LOCAL_HOST, port: int = dashboard.LOCAL_PORT, auth: bool = False
) -> dict[str, str]:
    """The server's environment: no job runner nor Huey consumers (a dashboard runs no
    jobs); with auth, the client's pair as the admin user, and the Host headers MLflow
    answers (the address it binds, and loopback for an SSH tunnel)."""
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    if auth:
        env["MLFLOW_AUTH_ADMIN_USERNAME"], env["MLFLOW_AUTH_ADMIN_PASSWORD"] = (os.environ[c] for c in CREDENTIALS)
        env.setdefault("MLFLOW_FLASK_SERVER_SECRET_KEY", secrets.token_hex(32))
        env.setdefault("MLFLOW_SERVER_ALLOWED_HOSTS", f"{host}:{port},localhost:*,127.0.0.1:*")
    return env


def check_port_free(host: str, port: int) -> None:
    """One line and exit 2 when another process listens on host:port, before the server
    starts (it would otherwise exit with a traceback in its log). SO_REUSEADDR, as uvicorn
    sets it: a port in TIME_WAIT from a previous server is free."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise invalid("--port", port, f"a port free on {host} ({e.strerror or e}; try another --port)") from None


def base_url(host: str, port: int) -> str:
    """Where the browser goes (and /health is asked): a wildcard bind answers on loopback."""
    shown = dashboard.LOCAL_HOST if host in WILDCARD_HOSTS else host
    return f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of a process group, from /proc; where there is no
    /proc, whether the group has any process at all (then [pgid])."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        state, _ppid, pgrp = stat[stat.rfind(")") + 2 :].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            members.append(int(entry.name))
    return members


def start(uri: str, host: str, port: int, log: Path, auth: bool = False) -> subprocess.Popen:
    """The server, in a new session (so its own process group, pgid = its pid, and no
    terminal's Ctrl-C reaches it directly: stop() does). On Linux it also gets SIGTERM
    when this process dies without stopping it (SIGKILL, the OOM killer): MLflow's
    command forwards that to its uvicorn worker and exits, so no server is left orphaned.
    With auth it runs in a folder of its own: MLflow keeps its users in ./basic_auth.db."""
    with open(log, "w") as out:
        return subprocess.Popen(
            server_argv(uri, host, port, auth),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=server_env(host, port, auth),
            cwd=tempfile.mkdtemp(prefix="looplab-dashboard-auth-") if auth else None,
            start_new_session=True,
            preexec_fn=_terminate_with_parent(os.getpid()) if sys.platform.startswith("linux") else None,
        )


def _terminate_with_parent(parent: int) -> Callable[[], None]:
    """In the child before it execs: prctl(PR_SET_PDEATHSIG, SIGTERM), and exit at once if
    the parent died before that call (the signal would then never come)."""

    def arm() -> None:
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return arm


def _last_line(log: Path) -> str:
    with contextlib.suppress(OSError):
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
        if lines:
            return lines[-1][:200]
    return "(empty)"


def wait_healthy(server: subprocess.Popen, base: str, log: Path, timeout: float = START_TIMEOUT_S) -> float:
    """Seconds until GET base/health answers 200; NotServing when the server exits first
    or the timeout passes."""
    began = time.monotonic()
    while True:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as answer:
                if answer.status == 200:
                    return time.monotonic() - began
        except OSError:  # not listening yet, or busy
            pass
        if server.poll() is not None:
            raise NotServing(
                f"mlflow server exited with status {server.returncode} before answering {base}/health; "
                f"its last line: {_last_line(log)} (log: {log})"
            )
        if time.monotonic() - began > timeout:
            raise NotServing(f"mlflow server did not answer {base}/health within {timeout:.0f} s (log: {log})")
        time.sleep(0.5)


def stop(server: subprocess.Popen, grace: float = STOP_GRACE_S) -> int:
    """SIGTERM to the server's whole process group, SIGKILL to what is left after `grace`
    seconds; returns how many processes needed the SIGKILL. Returns once no process of the
    group is left (a further Ctrl-C meanwhile is ignored: it would leave them running)."""
    pgid = server.pid
    with _signals_ignored():
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while _alive(server, pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        killed = len(group_members(pgid))
        if killed:
            _signal_group(pgid, signal.SIGKILL)
            deadline = time.monotonic() + grace  # a process stuck in the kernel dies when it returns
            while _alive(server, pgid) and time.monotonic() < deadline:
                time.sleep(0.05)
    return killed


def stop_once() -> Callable[[int, Any], None]:
    """A signal handler that asks to stop (KeyboardInterrupt) the first time only: a second
    signal (Ctrl-C twice, SIGINT then SIGTERM) landing while the first unwinds would
    otherwise interrupt stop() before it signals the group, and leave the server running."""
    asked: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        if not asked:
            asked.append(signum)
            raise KeyboardInterrupt

    return handler


def _alive(server: subprocess.Popen, pgid: int) -> bool:
    server.poll()  # reaps the leader, our child, so that it leaves the group
    return bool(group_members(pgid))


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    try:
        saved = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: signals go to the main thread anyway
        yield
        return
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


class Server:
    """The server of a store while the `with` block runs, stopped on the way out, whatever
    the way (an error, Ctrl-C): `with Server(uri) as s: s.wait_healthy(); ... s.base`.
    The port is checked first; the server's output goes to `log` (a new temporary file
    unless given)."""

    def __init__(
        self, uri: str, host: str = dashboard.LOCAL_HOST, port: int = dashboard.LOCAL_PORT, log: Path | None = None
    ):
        self.uri, self.host, self.port, self.log = uri, host, port, log
        self.auth = needs_auth(host)  # a host other machines reach: basic auth, or refused here
        self.base = base_url(host, port)
        self.process: subprocess.Popen | None = None
        self.pgid, self.started = 0, 0.0
        self.killed = 0  # processes that needed SIGKILL when it stopped

    def __enter__(self) -> "Server":
        check_port_free(self.host, self.port)
        if self.log is None:
            handle, name = tempfile.mkstemp(prefix=f"looplab-dashboard-{self.port}-", suffix=".log")
            os.close(handle)
            self.log = Path(name)
        self.started = time.monotonic()
        self.process = start(self.uri, self.host, self.port, self.log, self.auth)
        self.pgid = self.process.pid  # a session of its own: its group is its pid
        return self

    def wait_healthy(self, timeout: float = START_TIMEOUT_S) -> float:
        """Seconds from the server's start until /health answered (NotServing if it did not)."""
        assert self.process is not None and self.log is not None, "use it in a with block"
        wait_healthy(self.process, self.base, self.log, timeout)
        return time.monotonic() - self.started

    def __exit__(self, *exc) -> None:
        if self.process is not None:
            self.killed = stop(self.process)


def sweep_lines(uri: str, base: str, experiment: str | None = None) -> list[str]:
    """The URLs to open: the newest sweep run's trials view and page (of `experiment`, or
    of the whole store), else the experiment's runs, else the dashboard's front page.
    An unknown experiment is a one-line ConfigError naming those there are."""
    mc = tracking.client(uri)
    if experiment is not None:
        found = mc.get_experiment_by_name(experiment)
        if found is None:
            names = sorted(e.name for e in mc.search_experiments())
            raise invalid("--experiment", experiment, " | ".join(names) or "none: the store has no experiment")
        ids = [found.experiment_id]
    else:
        ids = [e.experiment_id for e in mc.search_experiments()]
    runs = mc.search_runs(
        ids,
        filter_string=f"tags.{tracking.LEVEL} = '{tracking.SWEEP}'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    if not runs:
        if experiment is None:
            return [f"dashboard:  {base}/"]
        return [f"runs:       {dashboard.url(base, dashboard.runs_route(ids[0]))}"]
    run = runs[0]
    exp = mc.get_experiment(run.info.experiment_id)
    name = run.info.run_name
    view = name if (tracking.SHARED_VIEW_TAG + name) in exp.tags else None  # the sweep saved its view
    return [
        f"experiment: {exp.name}",
        f"trials:     {dashboard.url(base, dashboard.runs_route(exp.experiment_id, view))}",
        f"sweep run:  {dashboard.url(base, dashboard.run_route(exp.experiment_id, run.info.run_id))}",
    ]
