#!/usr/bin/env bash
# The MLflow tracking server of a looplab cluster's head node, found again through its PID
# file: stopping it never matches process names, which would also hit other users' servers.
#
#   scripts/mlflow_server.sh start        # unless it runs: start it, wait for /health, print its URL
#   scripts/mlflow_server.sh status       # print its URL and exit 0 if it runs; exit 3 if not
#   scripts/mlflow_server.sh stop         # TERM to its process group, KILL after 30 s
#   scripts/mlflow_server.sh credentials  # write ~/.looplab/mlflow.env unless it exists
#
# LOOPLAB_MLFLOW_DIR (default ~/looplab-runs/mlflow) holds the SQLite store (mlflow.db), the
# artifacts the server proxies (artifacts/), its basic-auth users (basic_auth.db),
# server.log, server.pid and server.url. MLflow's own variables pick the address:
# MLFLOW_HOST (default 127.0.0.1) and MLFLOW_PORT (default 5000). MLFLOW_WORKERS, the number
# of server processes (read by `mlflow server` itself): default 4 on a head of 8 CPUs or
# more, else 1, as MLflow's 4 workers kept dying and restarting on a loaded 2-core machine
# (looplab/dashboard_server.py). MLflow's job runner and Huey consumers are off
# (MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false): a tracking server of training runs runs no jobs.
#
# Basic authentication: when MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD are set
# (the variables MLflow's client reads, so a sweep and its trials send the same pair), the
# server runs MLflow's basic-auth app and creates that user as its admin on its first
# start. MLflow keeps the user in basic_auth.db: changing the password later goes through
# MLflow's update-password API, not this variable. Without credentials the server only
# binds a loopback address. `credentials` writes a random pair to ~/.looplab/mlflow.env
# (mode 600), as export lines to source before `ray start`, `mlflow_server.sh start` and a
# sweep; the cluster files copy it from the head to every worker.
set -euo pipefail

DIR=${LOOPLAB_MLFLOW_DIR:-$HOME/looplab-runs/mlflow}
HOST=${MLFLOW_HOST:-127.0.0.1}
PORT=${MLFLOW_PORT:-5000}
CREDENTIALS=$HOME/.looplab/mlflow.env
PIDFILE=$DIR/server.pid
URLFILE=$DIR/server.url
LOG=$DIR/server.log
START_TIMEOUT_S=120
STOP_TIMEOUT_S=30

fail() {
  echo "mlflow_server.sh: $*" >&2
  exit 1
}

# The recorded PID is still our server: alive, the leader of the process group it was
# started in, and running mlflow. A PID that another process reuses after a crash or a
# reboot is left alone.
running() {
  local pid
  pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  [ "$(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ')" = "$pid" ] || return 1
  [[ $(ps -o args= -p "$pid") == *mlflow* ]]
}

random_hex() {
  od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'
}

start() {
  if running; then
    echo "MLflow server already running (pid $(cat "$PIDFILE")): $(cat "$URLFILE")"
    return
  fi
  case $HOST in
    0.0.0.0 | :: | '*') fail "MLFLOW_HOST=$HOST would serve every interface, the public one included: bind the node's private address or 127.0.0.1" ;;
  esac
  local args=(server --host "$HOST" --port "$PORT")
  if [ -n "${MLFLOW_TRACKING_USERNAME:-}${MLFLOW_TRACKING_PASSWORD:-}" ]; then
    [ -n "${MLFLOW_TRACKING_USERNAME:-}" ] && [ -n "${MLFLOW_TRACKING_PASSWORD:-}" ] \
      || fail "set both MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or neither"
    args+=(--app-name basic-auth)
    export MLFLOW_AUTH_ADMIN_USERNAME=$MLFLOW_TRACKING_USERNAME
    export MLFLOW_AUTH_ADMIN_PASSWORD=$MLFLOW_TRACKING_PASSWORD
    # Signs the sign-up page's CSRF token: one key shared by this server's processes.
    export MLFLOW_FLASK_SERVER_SECRET_KEY=${MLFLOW_FLASK_SERVER_SECRET_KEY:-$(random_hex 32)}
  else
    case $HOST in
      127.* | localhost | ::1) ;;
      *) fail "MLFLOW_HOST=$HOST is reachable from other machines: set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (see \`$0 credentials\`)" ;;
    esac
  fi
  case $HOST in
    127.* | localhost | ::1) ;;
    # MLflow answers only requests whose Host header it allows (DNS-rebinding protection;
    # by default loopback and private ranges): allow the address it binds, and loopback
    # for an SSH tunnel to it, whatever range that address is in.
    *) export MLFLOW_SERVER_ALLOWED_HOSTS=${MLFLOW_SERVER_ALLOWED_HOSTS:-$HOST:$PORT,localhost:*,127.0.0.1:*} ;;
  esac
  command -v mlflow >/dev/null || fail "mlflow is not on PATH"
  export MLFLOW_WORKERS=${MLFLOW_WORKERS:-$( [ "$(nproc)" -ge 8 ] && echo 4 || echo 1 )}
  export MLFLOW_SERVER_ENABLE_JOB_EXECUTION=${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}
  mkdir -p "$DIR"
  DIR=$(cd "$DIR" && pwd)
  PIDFILE=$DIR/server.pid URLFILE=$DIR/server.url LOG=$DIR/server.log
  rm -f "$PIDFILE" "$URLFILE"
  args+=(--backend-store-uri "sqlite:///$DIR/mlflow.db" --artifacts-destination "$DIR/artifacts")
  # setsid: a session and process group of its own, so that `stop` reaches the server's
  # worker processes too and the SSH session that ran this can end without a hangup.
  # The working directory is DIR because MLflow's basic-auth store defaults to the
  # relative sqlite:///basic_auth.db.
  (cd "$DIR" && exec setsid mlflow "${args[@]}" >>"$LOG" 2>&1 </dev/null) &
  local pid=$!
  echo "$pid" >"$PIDFILE"
  local url="http://$HOST:$PORT"
  local waited
  for ((waited = 0; waited < START_TIMEOUT_S; waited++)); do
    if curl -sf -o /dev/null --max-time 2 "$url/health"; then
      echo "$url" >"$URLFILE"
      echo "MLflow server running (pid $pid, log $LOG): $url"
      return
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -f "$PIDFILE"
      tail -n 20 "$LOG" >&2
      fail "the server exited before answering $url/health (log: $LOG)"
    fi
    sleep 1
  done
  stop >&2
  fail "no answer from $url/health after ${START_TIMEOUT_S} s (log: $LOG)"
}

stop() {
  if ! running; then
    rm -f "$PIDFILE" "$URLFILE"
    echo "MLflow server not running"
    return
  fi
  local pid waited
  pid=$(cat "$PIDFILE")
  kill -TERM -- "-$pid" 2>/dev/null || true
  for ((waited = 0; waited < STOP_TIMEOUT_S; waited++)); do
    if ! kill -0 -- "-$pid" 2>/dev/null; then
      rm -f "$PIDFILE" "$URLFILE"
      echo "MLflow server stopped (pid $pid)"
      return
    fi
    sleep 1
  done
  kill -KILL -- "-$pid" 2>/dev/null || true
  rm -f "$PIDFILE" "$URLFILE"
  echo "MLflow server killed after ${STOP_TIMEOUT_S} s (pid $pid)"
}

status() {
  if running && [ -f "$URLFILE" ]; then
    cat "$URLFILE"
  else
    echo "MLflow server not running" >&2
    exit 3
  fi
}

credentials() {
  if [ -e "$CREDENTIALS" ]; then
    echo "keeping $CREDENTIALS"
    return
  fi
  mkdir -p "$(dirname "$CREDENTIALS")"
  (
    umask 077
    printf 'export MLFLOW_TRACKING_USERNAME=looplab\nexport MLFLOW_TRACKING_PASSWORD=%s\n' "$(random_hex 18)" >"$CREDENTIALS"
  )
  echo "wrote $CREDENTIALS"
}

case ${1:-} in
  start | stop | status | credentials) "$1" ;;
  *)
    echo "usage: $0 start|stop|status|credentials" >&2
    exit 2
    ;;
esac
