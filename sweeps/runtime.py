"""What every sweep command does on the machine it runs on, around its own work: count
this machine's GPUs (the checks before Ray), check that a Ray --address answers and
that the storage and the tracking store can be written,
send Ray's console output to a log file (the commands print their own progress), and
write the analysis report at the end.

The driver (launch.py), the evaluation command (evaluate.py) and the bench command
(bench.py) share these; keeping them here, below all three, is what lets sweep.py,
evaluate.py and launch.py import each other in one direction only
(sweep ← evaluate ← launch).
"""

from __future__ import annotations

import contextlib
import socket
import sys
from pathlib import Path
from typing import Iterator

from looplab.dashboard import STORE_FILE
from looplab.errors import ConfigError, invalid

RAY_GCS_PORT, RAY_CLIENT_PORT = 6379, 10001  # Ray's defaults when an address names no port
RAY_CONNECT_SECONDS = 5.0


def local_gpus() -> int:
    """This machine's CUDA devices: 0 without CUDA, and 0 where torch cannot even be
    imported (a driver that only plans a cluster sweep)."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - a broken CUDA setup counts as no GPU here; the node checks say why
        return 0


def check_ray_address(flag: str, address: str) -> None:
    """A Ray --address answers now: "" (start a local Ray) and "auto" (the cluster this
    machine joined, which Ray finds itself) pass; HOST:PORT and ray://HOST:PORT must
    answer a gRPC client's first message within seconds (_grpc_handshake). ray.init would otherwise retry a dead
    address for about 95 s and end in a traceback, with the sweep's run left open."""
    if address in ("", "auto", "local"):
        return
    rest = address.removeprefix("ray://")
    host, colon, port = rest.rpartition(":")
    if not colon:
        host, port = rest, str(RAY_CLIENT_PORT if address.startswith("ray://") else RAY_GCS_PORT)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise invalid(flag, address, "auto, HOST:PORT (the head's GCS, port 6379) or ray://HOST:PORT (Ray Client)")
    try:
        answer = _grpc_handshake(host.strip("[]"), int(port))
    except OSError as e:
        raise invalid(
            flag, address, f"the address of a running Ray cluster (connecting to {host}:{port}: {e.strerror or e})"
        ) from None
    if answer is not None:
        raise invalid(flag, address, f"the address of a running Ray cluster ({host}:{port} answers, but {answer})")


# HTTP/2's client preface and an empty SETTINGS frame: what every gRPC client sends first
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
HTTP2_SETTINGS = 0x04  # the frame type a gRPC server answers the preface with


def _grpc_handshake(host: str, port: int) -> str | None:
    """None when host:port answers the first step of the gRPC handshake that Ray's GCS
    and Ray Client speak (an HTTP/2 SETTINGS frame back), else what it answered
    instead. A port that accepts a connection but is something else (a web server, a
    database) would otherwise keep ray.init retrying for a minute. OSError when nothing
    accepts the connection."""
    with socket.create_connection((host, port), timeout=RAY_CONNECT_SECONDS) as conn:
        conn.sendall(HTTP2_PREFACE)
        try:
            head = conn.recv(9)
        except TimeoutError:
            return f"says nothing to a gRPC client within {RAY_CONNECT_SECONDS:g} s"
    if len(head) == 9 and head[3] == HTTP2_SETTINGS:
        return None
    shown = head.split(b"\r\n")[0].decode("ascii", "replace") if head else "closes the connection"
    return f"not as a gRPC server would ({shown!r})" if head else f"{shown} on a gRPC client"


@contextlib.contextmanager
def console_to_log(path: Path) -> Iterator[None]:
    """Ray and Tune's own console output (configuration boxes, TensorBoard hints,
    status tables) into a log file in the storage path: the sweep prints its own
    progress instead."""
    with open(path, "a") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        yield


def write_report(
    uri: str, experiment: str, sweep_run: str | None, out: Path, trial_keys: list[str] | None = None
) -> dict[str, Path]:
    """The analysis report (frontiers, tables, report.html), logged to the sweep run. With
    trial_keys (a sweep's end: the final stage keys of the trials it ran or reused), it
    reads that sweep alone: the runs under its run, and the trials it reused whole from
    another sweep's run. Without (the evaluation and bench commands, which work over an
    experiment), every run of the experiment; the page lists the sweeps it pools. A
    sweep's results never depend on it: without the analysis extra, or when the runs
    support no plot, it says so and the sweep still succeeds."""
    try:
        from analysis.report import ReportOptions, build_report
    except ImportError as e:
        print(f"analysis skipped ({e}); install the analysis extra: pip install -e '.[analysis]'", file=sys.stderr)
        return {}
    one_sweep = trial_keys is not None and sweep_run is not None
    options = ReportOptions(
        sweep_run_id=sweep_run,
        scope="sweep" if one_sweep else "experiment",
        trial_keys=tuple(trial_keys or ()) if one_sweep else (),
    )
    try:
        return build_report(uri, [experiment], out, options)
    except Exception as e:  # noqa: BLE001 - the sweep finished; a report problem is reported, not raised
        print(f"analysis failed: {type(e).__name__}: {e}", file=sys.stderr)
        return {}


def check_storage_path(path: str) -> None:
    """The storage (a folder, or an object-store prefix) exists or can be made, and is
    writable: one small object written and removed."""
    from trainables.storage import Storage

    storage = Storage(path)
    if not storage.remote:  # a folder: made and written, then removed again (looplab/destinations.py)
        from looplab import destinations

        try:
            destinations.output_dir("--storage-path", storage.root)
        except ConfigError as e:
            raise e.renamed("--storage-path", path) from None
        return
    probe = storage.path(".looplab-write-test")
    try:
        storage.write_text(probe, "")
        storage.delete_file(probe)
    except (OSError, ValueError) as e:
        raise invalid(
            "--storage-path",
            path,
            f"an object-store prefix this process can write (credentials, bucket) "
            f"({getattr(e, 'strerror', None) or e})",
        ) from None


def check_tracking_uri(uri: str, storage_path: str) -> None:
    """The tracking store can be written now (looplab/destinations.py: a server answers, an
    SQLite file's folder or a store folder can be made, a database opens); with storage
    on an object store there is no local folder for the default SQLite store, so a
    --tracking-uri is needed."""
    from looplab import destinations
    from trainables.storage import Storage

    storage = Storage(storage_path)
    if not uri and storage.remote:
        raise invalid(
            "--tracking-uri",
            uri,
            "an MLflow server (http://HOST:PORT) or sqlite:///PATH when --storage-path is an object store",
        )
    if uri:
        destinations.tracking_uri("--tracking-uri", uri)
        return
    # The default, sqlite:///STORAGE/mlflow.db: the storage's check writes its folder; a
    # database already there must be whole
    default = storage.scratch() / STORE_FILE
    if default.is_file():
        destinations.intact_sqlite("--storage-path", storage_path, default)
