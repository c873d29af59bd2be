"""The cluster files and the MLflow server they start on the head.

cluster.yaml (AWS) and cluster-onprem.yaml (Ray's local provider) go through Ray's own
config preparation and validation offline, plus the checks that make them come up as
written and safe by default. scripts/mlflow_server.sh runs for real against
`mlflow server` on 127.0.0.1. `ray up` itself needs a cloud account or SSH hosts."""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import socket
import stat
import subprocess
import urllib.error
import urllib.request
from base64 import b64encode
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CLUSTER_FILES = ["cluster.yaml", "cluster-onprem.yaml"]
SCRIPT = REPO / "scripts" / "mlflow_server.sh"
CREDENTIALS = "~/.looplab/mlflow.env"  # written on the head, copied to the workers
# What a user would have to fill in before `ray up` works: EFS names, ids typed into an
# example (AMIs are region-bound and cannot be checked offline), <...>, XXXX, YOUR-...
PLACEHOLDER = re.compile(
    r"EFS_DNS|FILE_SYSTEM_ID|\bfs-[0-9a-fA-FX]{4,}|\bami-[0-9a-f]{8,17}\b"
    r"|<[^<>\s]+>|X{4,}|\bYOUR[-_]|\bBUCKET\b"
)


def load(name: str) -> dict:
    return yaml.safe_load((REPO / name).read_text())


def prepared(name: str) -> dict:
    """The config as `ray up` sees it: Ray's defaults filled in, setup commands merged."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    cfg = prepare_config(copy.deepcopy(load(name)))
    validate_config(cfg)
    return cfg


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("name", CLUSTER_FILES)
def test_cluster_file_passes_rays_validation_without_placeholders(name):
    pytest.importorskip("ray")
    cfg = prepared(name)
    assert cfg["file_mounts"] == {"~/looplab": "."}
    # Non-comment text only: comments may show optional setups with names to fill in.
    values = json.dumps(load(name))
    assert not PLACEHOLDER.findall(values)


def test_aws_cluster_comes_up_without_hand_made_resources():
    pytest.importorskip("ray")
    pytest.importorskip("boto3")
    from ray.autoscaler._private.aws.config import _check_ami

    cfg = prepared("cluster.yaml")
    assert cfg["available_node_types"][cfg["head_node_type"]]["resources"] == {"CPU": 0}  # no trials on the head
    # Images: a public parameter AWS keeps current in every region, resolved by EC2 at
    # launch. Ray passes it through unchanged (it would replace "" or latest_dlami with its
    # Ubuntu 18.04 DLAMI, on which this project does not install).
    images = {t: n["node_config"]["ImageId"] for t, n in cfg["available_node_types"].items()}
    assert all(i.startswith("resolve:ssm:/aws/service/") for i in images.values()), images
    _check_ami(cfg)
    assert {t: n["node_config"]["ImageId"] for t, n in cfg["available_node_types"].items()} == images
    # Storage: nothing to mount (S3 through the instance profile, which workers get too).
    commands = [c for key in ("setup_commands", "head_setup_commands", "worker_setup_commands") for c in cfg[key]]
    assert not any(re.search(r"\bmount\b", c) for c in commands)
    worker = cfg["available_node_types"]["gpu_worker"]["node_config"]
    assert worker["IamInstanceProfile"] == {"Name": "ray-autoscaler-v1"}  # the role Ray creates for the head


def test_gpu_workers_try_prebuilt_kernels_before_compiling():
    pytest.importorskip("ray")
    cfg = prepared("cluster.yaml")
    (kernels,) = [c for c in cfg["worker_setup_commands"] if "[gpu]" in c]
    first, fallback = kernels.split("||", 1)
    assert "--no-build-isolation" in first and "FORCE_BUILD" not in first
    assert "MAMBA_FORCE_BUILD=TRUE" in fallback and "CAUSAL_CONV1D_FORCE_BUILD=TRUE" in fallback
    assert not any("[gpu" in c for c in cfg["head_setup_commands"])  # the head trains nothing


def test_every_gpu_worker_runs_the_doctor_last():
    """A node whose health check fails fails its setup, which `ray up` reports."""
    pytest.importorskip("ray")
    cfg = prepared("cluster.yaml")
    last = cfg["worker_setup_commands"][-1]
    assert last.startswith("looplab doctor --quick") and "--json" in last
    assert not any("doctor" in c for c in cfg["head_setup_commands"])


@pytest.mark.parametrize("name", CLUSTER_FILES)
def test_cluster_file_safe_defaults(name):
    pytest.importorskip("ray")
    cfg = prepared(name)
    values = json.dumps(load(name))
    assert "0.0.0.0" not in values and "--dashboard-host" not in values  # Ray's dashboard stays on loopback
    assert "RAY_AUTH_MODE=disabled" not in values
    # Every node starts Ray with token authentication and the MLflow credentials in its
    # environment (trials inherit it from the raylet and send them to MLflow).
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        starts = [c for c in cfg[key] if "ray start" in c]
        assert starts and all(
            re.match(rf"\. {re.escape(CREDENTIALS)} && RAY_AUTH_MODE=token ray start ", c) for c in starts
        ), starts
    # The head makes the token and the credentials; Ray copies both to every worker.
    assert set(cfg["cluster_synced_files"]) == {"~/.ray/auth_token", CREDENTIALS}
    setup = " ; ".join(cfg["head_setup_commands"])
    assert "ray get-auth-token --generate" in setup and "scripts/mlflow_server.sh credentials" in setup
    (mlflow,) = [c for c in cfg["head_start_ray_commands"] if "mlflow_server.sh" in c]
    assert mlflow.startswith(f". {CREDENTIALS} && MLFLOW_HOST=") and mlflow.endswith("scripts/mlflow_server.sh start")


def test_no_process_is_stopped_by_a_name_pattern():
    """`pkill -f "bin/mlflow server"` ends any matching process of any user."""
    for path in [*CLUSTER_FILES, "README.md", "docs/cluster.md", "scripts/mlflow_server.sh"]:
        text = (REPO / path).read_text()
        assert not re.search(r"\b(pkill|pgrep|killall)\b", text), path
    assert "scripts/mlflow_server.sh stop" in (REPO / "docs" / "cluster.md").read_text()


def run_script(command: str, env: dict, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), command], env=env, capture_output=True, text=True, **kwargs)


@pytest.fixture
def script_env(tmp_path):
    """The script's environment: its state and HOME in tmp_path, no MLflow credentials,
    one server process without MLflow's job runner (a faster start)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in ("MLFLOW_HOST", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_SERVER_ALLOWED_HOSTS")
    }
    (tmp_path / "home").mkdir()
    return {
        **env,
        "HOME": str(tmp_path / "home"),
        "LOOPLAB_MLFLOW_DIR": str(tmp_path / "mlflow"),
        "MLFLOW_PORT": str(free_port()),
        "MLFLOW_WORKERS": "1",
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    }


def test_credentials_file_is_private_and_kept(script_env):
    path = Path(CREDENTIALS.replace("~", script_env["HOME"]))
    assert run_script("credentials", script_env).returncode == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    pairs = dict(re.findall(r"^export (\w+)=(\S+)$", path.read_text(), re.M))
    assert set(pairs) == {"MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"}
    assert len(pairs["MLFLOW_TRACKING_PASSWORD"]) >= 12  # MLflow's minimum for its admin user
    before = path.read_text()
    assert run_script("credentials", script_env).returncode == 0
    assert path.read_text() == before  # a rerun of `ray up` keeps the password


@pytest.mark.parametrize("host, credentials", [("0.0.0.0", True), ("10.1.2.3", False), ("127.0.0.1", "half")])
def test_start_refuses_unsafe_setups(script_env, host, credentials):
    env = {**script_env, "MLFLOW_HOST": host}
    if credentials:
        env["MLFLOW_TRACKING_USERNAME"] = "looplab"
    if credentials is True:
        env["MLFLOW_TRACKING_PASSWORD"] = "0123456789abcdef"
    done = run_script("start", env, timeout=30)
    assert done.returncode == 1 and "mlflow_server.sh:" in done.stderr
    assert not Path(script_env["LOOPLAB_MLFLOW_DIR"], "server.pid").exists()


def test_stop_leaves_a_reused_pid_alone(script_env):
    """A PID file whose process is no longer the server (a crash, a reboot, the PID reused by
    another program, here a process-group leader like the server) is stale: not running,
    nothing killed."""
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        state = Path(script_env["LOOPLAB_MLFLOW_DIR"])
        state.mkdir()
        (state / "server.pid").write_text(f"{other.pid}\n")
        assert run_script("status", script_env).returncode == 3
        assert run_script("stop", script_env).returncode == 0
        assert other.poll() is None and not (state / "server.pid").exists()
    finally:
        other.kill()
        other.wait()


def get(url: str, auth: tuple[str, str] | None = None) -> int:
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.slow  # starts and stops an MLflow server, 14 s on 2 cores: .ci/run runs it after the suite
def test_server_lifecycle_by_pid_file(script_env):
    pytest.importorskip("mlflow")
    url = f"http://127.0.0.1:{script_env['MLFLOW_PORT']}"
    state = Path(script_env["LOOPLAB_MLFLOW_DIR"])
    started = run_script("start", script_env, timeout=180)
    pid = int((state / "server.pid").read_text()) if (state / "server.pid").exists() else None
    try:
        assert started.returncode == 0, started.stderr + (state / "server.log").read_text()[-2000:]
        assert url in started.stdout and get(url + "/health") == 200
        status = run_script("status", script_env)
        assert status.returncode == 0 and status.stdout.strip() == url
        # The server and its uvicorn process(es) form one process group led by the PID.
        assert os.getpgid(pid) == pid
        table = subprocess.run(["ps", "-eo", "pid=,pgid="], capture_output=True, text=True).stdout
        assert sum(int(pgid) == pid for _, pgid in (line.split() for line in table.splitlines())) >= 2
        again = run_script("start", script_env, timeout=30)  # what a rerun of `ray up` does
        assert again.returncode == 0 and int((state / "server.pid").read_text()) == pid
        assert run_script("stop", script_env, timeout=60).returncode == 0
        assert not group_alive(pid) and not (state / "server.pid").exists()
        assert run_script("status", script_env).returncode == 3
        assert (state / "mlflow.db").exists()  # the store stays for the next start
    finally:
        if pid and group_alive(pid):
            os.killpg(pid, signal.SIGKILL)


@pytest.mark.soak  # its start took ~25 s on 2 busy cores
def test_server_requires_the_credentials_it_was_started_with(script_env, monkeypatch):
    pytest.importorskip("mlflow")
    pytest.importorskip("flask_wtf", reason="MLflow's basic-auth app needs the mlflow[auth] extra")
    from mlflow import MlflowClient

    creds = ("looplab", "0123456789abcdef")
    env = {**script_env, "MLFLOW_TRACKING_USERNAME": creds[0], "MLFLOW_TRACKING_PASSWORD": creds[1]}
    state = Path(script_env["LOOPLAB_MLFLOW_DIR"])
    started = run_script("start", env, timeout=180)
    try:
        assert started.returncode == 0, started.stderr + (state / "server.log").read_text()[-2000:]
        url = run_script("status", env).stdout.strip()
        search = url + "/api/2.0/mlflow/experiments/search?max_results=1"
        assert get(url + "/health") == 200  # the sweep's reachability check needs no password
        assert get(search) == 401 and get(search, (creds[0], "wrong-password!")) == 401
        assert get(search, creds) == 200
        # MLflow's client sends the standard variables, as a sweep and its trials do.
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", creds[0])
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", creds[1])
        assert MlflowClient(url).search_experiments()
        assert (state / "basic_auth.db").exists()  # users live beside the store
    finally:
        run_script("stop", env, timeout=60)
