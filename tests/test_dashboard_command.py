"""`looplab dashboard STORE` (issue 37): the command a sweep prints serves MLflow's
dashboard, also on a loaded machine, and Ctrl-C leaves no MLflow process behind.

The bare `mlflow server` a sweep printed before restarted its 4 uvicorn workers 43 times
in 7 minutes on a loaded 2-core machine and left orphans on SIGTERM. The references here
are the operating system's: /proc's process table (which processes descend from the
command, which process group they are in, whether any is left), a socket that holds a
port, HTTP answers from the server.
"""

from __future__ import annotations

import base64
import contextlib
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

from looplab import cli, dashboard, dashboard_server

COMMAND = [sys.executable, "-m", "looplab.cli", "dashboard"]  # the `looplab` script, from this checkout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_line_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exited:  # argparse's own errors exit
        raise SystemExit(cli.main(argv))
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


# ---- bad inputs: one line, exit 2, no server started ---------------------------------------


def test_a_missing_store_is_one_line(tmp_path, capsys):
    err = _one_line_error(capsys, ["dashboard", str(tmp_path / "nowhere")])
    assert "STORE=" in err and "no such file or folder" in err
    err = _one_line_error(capsys, ["dashboard", str(tmp_path)])  # a folder, but no mlflow.db in it
    assert "a folder without mlflow.db" in err
    err = _one_line_error(capsys, ["dashboard", f"sqlite:///{tmp_path / 'none.db'}"])
    assert "STORE=" in err
    err = _one_line_error(capsys, ["dashboard", "http://127.0.0.1:5000"])
    assert "a tracking server serves its own dashboard" in err


def test_a_bad_port_is_one_line(tmp_path, capsys):
    (tmp_path / "mlflow.db").touch()
    for port in ("0", "65536", "http"):
        assert "--port" in _one_line_error(capsys, ["dashboard", str(tmp_path), "--port", port])


def test_a_port_in_use_is_one_line_and_starts_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # a log of this port from another run is not this one's
    (tmp_path / "mlflow.db").touch()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        err = _one_line_error(capsys, ["dashboard", str(tmp_path), "--port", str(port)])
    assert f"--port={port} is invalid" in err and "a port free on 127.0.0.1" in err
    assert not list(Path(tempfile.gettempdir()).glob(f"looplab-dashboard-{port}-*.log"))  # no server started


def test_a_host_other_machines_reach_needs_auth_else_one_line(tmp_path, capsys, monkeypatch):
    """One rule with scripts/mlflow_server.sh: a wildcard never (MLflow would answer any
    client that sends a loopback Host header), another address only with credentials."""
    (tmp_path / "mlflow.db").touch()
    for name in dashboard_server.CREDENTIALS:
        monkeypatch.delenv(name, raising=False)
    for host in ("0.0.0.0", "::"):
        err = _one_line_error(capsys, ["dashboard", str(tmp_path), "--host", host])
        assert f"--host={host!r} is invalid" in err and "a wildcard serves every interface" in err
    err = _one_line_error(capsys, ["dashboard", str(tmp_path), "--host", "10.1.2.3"])
    assert "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD set" in err
    for host in ("127.0.0.1", "127.0.0.2", "localhost", "::1"):
        assert dashboard_server.needs_auth(host) is False
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "ada")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "a long secret")
    assert dashboard_server.needs_auth("10.1.2.3") is True
    with pytest.raises(Exception, match="a wildcard"):  # credentials do not make a wildcard safe
        dashboard_server.needs_auth("0.0.0.0")
    argv = dashboard_server.server_argv("sqlite:///x.db", "10.1.2.3", 5000, auth=True)
    assert argv[-2:] == ["--app-name", "basic-auth"]
    env = dashboard_server.server_env("10.1.2.3", 5000, auth=True)
    assert (env["MLFLOW_AUTH_ADMIN_USERNAME"], env["MLFLOW_AUTH_ADMIN_PASSWORD"]) == ("ada", "a long secret")
    assert env["MLFLOW_SERVER_ALLOWED_HOSTS"].startswith("10.1.2.3:5000,")


def test_a_damaged_store_is_one_line(tmp_path, capsys):
    (tmp_path / "mlflow.db").write_bytes(b"SQLite format 3\x00" + b"\xff" * 4000)  # a header, no database
    err = _one_line_error(capsys, ["dashboard", str(tmp_path)])
    assert "undamaged SQLite store" in err and "mlflow.db" in err


def test_the_store_a_sweep_prints_is_its_storage_folder(tmp_path):
    assert dashboard.server_command("sqlite:///runs/beta/mlflow.db") == "looplab dashboard runs/beta"
    assert dashboard.server_command("sqlite:////data/my runs/mlflow.db", port=5001) == (
        "looplab dashboard '/data/my runs' --port 5001"
    )
    assert dashboard.server_command("sqlite:///other.db") == "looplab dashboard sqlite:///other.db"
    # ... and the command reads each back as that store.
    (tmp_path / "mlflow.db").touch()
    assert dashboard_server.store_uri(str(tmp_path)) == f"sqlite:///{tmp_path}/mlflow.db"
    assert dashboard_server.store_uri(str(tmp_path / "mlflow.db")) == f"sqlite:///{tmp_path}/mlflow.db"


# ---- the server's life, with stand-ins for MLflow: fast ------------------------------------


def _group(script: str) -> subprocess.Popen:
    """A process group like the server's: a leader and a child, running `script`."""
    child = f"import os, signal, time\n{script}\nprint('up', flush=True)\ntime.sleep(60)"
    leader = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {child!r}])\n{child}"
    proc = subprocess.Popen([sys.executable, "-c", leader], start_new_session=True, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for _ in range(2):  # both have their handlers in place
        assert proc.stdout.readline().strip() == "up"
    return proc


def _members(pgid: int) -> set[int]:
    """Live processes of the group, read from /proc here (not by the code under test)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.add(int(stat.parent.name))
    return found


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_stop_ends_the_whole_group_and_kills_what_ignores_sigterm():
    polite = _group("")
    assert len(_members(polite.pid)) == 2
    assert dashboard_server.stop(polite, grace=20) == 0  # SIGTERM was enough
    assert _members(polite.pid) == set()

    stubborn = _group("signal.signal(signal.SIGTERM, signal.SIG_IGN)")
    assert dashboard_server.stop(stubborn, grace=0.5) == 2
    assert _members(stubborn.pid) == set()


def test_only_the_first_signal_asks_to_stop():
    """A second signal while the first unwinds must not interrupt the stop (seen: SIGINT
    pending on another thread, then SIGTERM: the stop was cut short, the server left)."""
    handler = dashboard_server.stop_once()
    with pytest.raises(KeyboardInterrupt):
        handler(signal.SIGINT, None)
    assert handler(signal.SIGTERM, None) is None
    assert handler(signal.SIGINT, None) is None


def test_a_server_that_never_answers_or_exits_is_one_line(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("starting\nOSError: [Errno 98] Address already in use\n")
    base = f"http://127.0.0.1:{free_port()}"
    exited = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(dashboard_server.NotServing, match=r"exited with status 3 .*Address already in use") as e:
        dashboard_server.wait_healthy(exited, base, log, timeout=60)
    assert len(str(e.value).splitlines()) == 1
    silent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        with pytest.raises(dashboard_server.NotServing, match=r"did not answer .*/health within 1 s"):
            dashboard_server.wait_healthy(silent, base, log, timeout=1)
    finally:
        dashboard_server.stop(silent)


# ---- the real thing: `looplab dashboard` on a tiny store, HTTP, Ctrl-C ---------------------


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory):
    """A store like a sweep's: an experiment with a sweep run and its saved view."""
    pytest.importorskip("mlflow")
    from looplab import tracking

    root = tmp_path_factory.mktemp("store")
    mc = tracking.client(f"sqlite:///{root / 'mlflow.db'}")
    experiment = tracking.ensure_experiment(mc, "beta_ablation-tiny", root)
    run = mc.create_run(experiment, tags={tracking.LEVEL: tracking.SWEEP}, run_name="beta_ablation-abc")
    tracking.save_view(mc, experiment, "beta_ablation-abc", dashboard.view_tag_value("beta_ablation-abc", {}, 0))
    return root, experiment, run.info.run_id


def test_the_urls_are_the_newest_sweeps_and_an_unknown_experiment_is_one_line(tiny_store):
    from looplab import tracking
    from looplab.errors import ConfigError

    root, experiment, run_id = tiny_store
    uri, base = f"sqlite:///{root / 'mlflow.db'}", "http://127.0.0.1:5001"
    lines = dashboard_server.sweep_lines(uri, base)
    assert lines == dashboard_server.sweep_lines(uri, base, "beta_ablation-tiny")
    assert lines[1] == (
        f"trials:     {base}/#/experiments/{experiment}/runs"
        "?workflowType=machine_learning&viewStateShareKey=beta_ablation-abc"
    )
    with pytest.raises(ConfigError) as e:
        dashboard_server.sweep_lines(uri, base, "beta_ablation-debug")
    assert str(e.value) == "--experiment='beta_ablation-debug' is invalid; allowed: Default | beta_ablation-tiny"
    bare = tracking.ensure_experiment(tracking.client(uri), "no-sweep", root)  # runs, but no sweep run
    assert dashboard_server.sweep_lines(uri, base, "no-sweep") == [
        f"runs:       {base}/#/experiments/{bare}/runs?workflowType=machine_learning"
    ]


@contextlib.contextmanager
def busy_cores() -> Iterator[int]:
    """One busy-loop process per core this process may run on, while the block runs."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        yield cores
    finally:
        for p in busy:
            p.kill()
            p.wait()


@pytest.fixture
def cpu_load(request):
    """A synthetic CPU load while the test runs (issue 37's acceptance: a busy loop per core), or none."""
    with busy_cores() if request.param == "busy" else contextlib.nullcontext(0) as cores:
        yield cores


def _lines(proc: subprocess.Popen) -> queue.Queue:
    """The command's output lines as they come (a thread reads the pipe)."""
    lines: queue.Queue = queue.Queue()

    def read():
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


def _until(lines: queue.Queue, pattern: str, timeout: float) -> list[str]:
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        if line is None:
            raise AssertionError("the command ended early:\n" + "\n".join(seen))
        seen.append(line)
        if re.search(pattern, line):
            return seen


def _descendants(pid: int) -> dict[int, tuple[int, str]]:
    """pid -> (process group, command line) of every process below pid, from /proc."""
    table = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            command = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        table[int(stat.parent.name)] = (int(fields[1]), int(fields[2]), command)
    below, frontier = {}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, (ppid, pgid, command) in table.items():
            if ppid == parent and child not in below:
                below[child] = (pgid, command)
                frontier.append(child)
    return below


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return answer.status, answer.read().decode(errors="replace")


class Served:
    """What `looplab dashboard` printed up to "Ctrl-C stops it", the processes it started
    (pid -> (process group, command line)), and, once stopped, its last line."""

    printed: list[str]
    server: dict[int, tuple[int, str]]
    last: str = ""

    def url(self, label: str) -> str:
        return next(line.split()[-1] for line in self.printed if line.startswith(label))


@contextlib.contextmanager
def dashboard_command(
    argv: list[str], timeout: float = 300, signals: tuple[int, ...] = (signal.SIGINT,)
) -> Iterator[Served]:
    """Run `looplab dashboard` until it prints its URLs and yield them; then `signals`
    back to back (a Ctrl-C) and assert that it exits 0 leaving no process of those it
    started, in any of their process groups."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    served = Served()
    served.server = {}
    survivors: dict[int, set[int]] = {}
    try:
        lines = _lines(proc)
        served.printed = _until(lines, r"^Ctrl-C stops it", timeout)
        served.server = _descendants(proc.pid)
        yield served
        for sig in signals:
            proc.send_signal(sig)
        assert proc.wait(timeout=60) == 0
        served.last = _until(lines, r"^stopped", 5)[-1]
    finally:
        if proc.poll() is None:  # it did not stop: end what it started (the test fails below)
            proc.kill()
        for pgid in {pgid for pgid, _ in served.server.values()} - {os.getpgrp()}:
            survivors[pgid] = _members(pgid)
            if survivors[pgid]:
                os.killpg(pgid, signal.SIGKILL)
    assert os.getpgrp() not in {pgid for pgid, _ in served.server.values()}  # a process group of its own
    assert not any(survivors.values()), f"left behind: {survivors} of {served.server}"


@pytest.mark.slow  # an MLflow server's start: 20-60 s on 2 cores, minutes under load
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
@pytest.mark.parametrize("cpu_load", ["idle", "busy"], indirect=True)
def test_the_command_serves_the_store_and_ctrl_c_leaves_nothing(tiny_store, cpu_load):
    root, experiment, run_id = tiny_store
    port = free_port()
    # Idle, an impatient stop too: Ctrl-C and SIGTERM back to back.
    signals = (signal.SIGINT,) if cpu_load else (signal.SIGINT, signal.SIGTERM)
    with dashboard_command([*COMMAND, str(root), "--port", str(port)], signals=signals) as served:
        base = re.search(r" at (http://\S+)/ ", served.printed[0]).group(1)
        assert _get(f"{base}/health") == (200, "OK")
        status, page = _get(served.url("trials:"))  # the single-page app; what follows '#' is the browser's
        assert status == 200 and "<html" in page.lower()
    assert served.printed[1:4] == [
        "experiment: beta_ablation-tiny",
        f"trials:     http://127.0.0.1:{port}/#/experiments/{experiment}/runs"
        "?workflowType=machine_learning&viewStateShareKey=beta_ablation-abc",
        f"sweep run:  http://127.0.0.1:{port}/#/experiments/{experiment}/runs/{run_id}?workflowType=machine_learning",
    ]
    assert served.last == "stopped: no MLflow process left"
    # One worker, and no job runner or Huey consumer: the processes the bare command added.
    commands = [command for _, command in served.server.values()]
    assert sum("uvicorn" in c for c in commands) == 1, commands
    assert not [c for c in commands if "huey" in c or "_job_runner" in c], commands


@pytest.mark.slow  # an MLflow server's start: 20-60 s on 2 cores
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_killed_command_leaves_no_server(tiny_store):
    """SIGKILL (or the OOM killer) gives `looplab dashboard` no chance to stop the server:
    the server learns of it from the kernel and exits, its port free again."""
    root, _, _ = tiny_store
    port = free_port()
    proc = subprocess.Popen(
        [*COMMAND, str(root), "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    started: dict[int, tuple[int, str]] = {}
    try:
        _until(_lines(proc), r"^Ctrl-C stops it", 300)
        started = _descendants(proc.pid)
        assert any("uvicorn" in command for _, command in started.values()), started
        proc.kill()
        proc.wait(timeout=10)
        deadline = time.monotonic() + 60
        while any(_members(pgid) for pgid, _ in started.values()) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = {pgid: _members(pgid) for pgid, _ in started.values() if _members(pgid)}
        assert not left, f"left behind after SIGKILL: {left} of {started}"
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pgid in {pgid for pgid, _ in started.values()} - {os.getpgrp()}:
            if _members(pgid):
                os.killpg(pgid, signal.SIGKILL)


def _reachable_address() -> str | None:
    """This machine's address other machines would use (not loopback), if it has one."""
    for probe in (("192.0.2.1", 9), ("10.255.255.255", 1)):  # UDP connect sends nothing
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(probe)
            address = s.getsockname()[0]
            if not address.startswith("127."):
                return address
    return None


@pytest.mark.slow  # an MLflow server's start: 10-60 s on 2 cores
def test_a_reachable_host_is_served_only_with_basic_auth(tiny_store, monkeypatch, tmp_path):
    """On a non-loopback address the server asks every request for the pair: without it
    401 (also with a loopback Host header, which fooled a wildcard bind), with it 200."""
    pytest.importorskip("flask_wtf", reason="MLflow's basic-auth app needs the mlflow[auth] extra")
    host = _reachable_address()
    if host is None:
        pytest.skip("no address but loopback")
    root, _, _ = tiny_store
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "ada")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "a-long-test-secret")
    port = free_port()
    search = f"http://{host}:{port}/api/2.0/mlflow/experiments/search?max_results=1"
    with dashboard_server.Server(f"sqlite:///{root / 'mlflow.db'}", host, port, tmp_path / "server.log") as server:
        server.wait_healthy()
        for headers in ({}, {"Host": f"localhost:{port}"}):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(urllib.request.Request(search, headers=headers), timeout=30)
            assert refused.value.code == 401
        token = base64.b64encode(b"ada:a-long-test-secret").decode()
        request = urllib.request.Request(search, headers={"Authorization": f"Basic {token}"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 200
