#!/usr/bin/env bash
# Run a published runstate-sdk release's integration tests against a local three-node cluster:
#
#   cluster.sh VERSION          e.g.  cluster.sh 0.3.0
#
# Starts `runstate cluster up --nodes 3` (the `runstate` on PATH, else ./.venv/bin/runstate) on
# free 127.0.0.1 ports with a fresh data dir, creates the tests' space and a key of it with every
# permission, runs run.sh VERSION against the first node (whichever node leads: a follower
# forwards), and stops the cluster. The same environment as run.sh applies (REALSDK_PYTEST_ARGS,
# RUNSTATE_REALSDK_RUNS, ...). Exit status: run.sh's, or 1 when the cluster did not come up.

set -u -o pipefail
[ $# -eq 1 ] || { echo "usage: $0 VERSION" >&2; exit 2; }
VERSION=$1
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SPACE_ID=${REALSDK_SPACE_ID:-realsdk}
log() { echo "[cluster.sh] $*" >&2; }
die() { echo "[cluster.sh] $*" >&2; exit 1; }

if [ -n "${RUNSTATE_SERVER_CMD:-}" ]; then read -r -a SERVER_CMD <<<"$RUNSTATE_SERVER_CMD"
elif command -v runstate >/dev/null 2>&1; then SERVER_CMD=("$(command -v runstate)")
elif [ -x .venv/bin/runstate ]; then SERVER_CMD=("$PWD/.venv/bin/runstate")
else die "no server command: set RUNSTATE_SERVER_CMD or run from the project's root"; fi

# A base port with its 3 API ports and 3 Raft ports (base + 100 ...) free on 127.0.0.1.
BASE_PORT=$(python3 - <<'PY'
import random, socket
def free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port)); return True
        except OSError:
            return False
for _ in range(200):
    base = random.randrange(20000, 40000)
    if all(free(base + offset) for offset in (0, 1, 2, 100, 101, 102)):
        print(base); break
PY
)
[ -n "$BASE_PORT" ] || die "no free ports"
DATA=$(mktemp -d -t runstate-realsdk-cluster.XXXXXX)
"${SERVER_CMD[@]}" cluster up --nodes 3 --base-port "$BASE_PORT" --data-dir "$DATA" >"$DATA/cluster.log" 2>&1 </dev/null &
CLUSTER_PID=$!
stop_cluster() {
  kill -0 "$CLUSTER_PID" 2>/dev/null || return 0
  kill -TERM "$CLUSTER_PID" 2>/dev/null
  for _ in $(seq 1 200); do kill -0 "$CLUSTER_PID" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$CLUSTER_PID" 2>/dev/null
  wait "$CLUSTER_PID" 2>/dev/null
  log "cluster stopped (data and logs in $DATA)"
}
trap stop_cluster EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

URL=http://127.0.0.1:$BASE_PORT
up=
for _ in $(seq 1 240); do
  kill -0 "$CLUSTER_PID" 2>/dev/null || { cat "$DATA/cluster.log" >&2; die "runstate cluster up exited"; }
  healthy=0
  for offset in 0 1 2; do
    [ "$(curl --noproxy '*' -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$((BASE_PORT + offset))/v1/health")" = 200 ] && healthy=$((healthy + 1))
  done
  if [ "$healthy" = 3 ] && [ -s "$DATA/bootstrap.key" ]; then up=1; break; fi
  sleep 0.25
done
[ -n "$up" ] || { cat "$DATA/cluster.log" >&2; die "the cluster was not healthy in 60 s"; }
ADMIN_KEY=$(cat "$DATA/bootstrap.key")
log "three nodes up at $URL (+1, +2)"

api() {  # api METHOD PATH JSON -> prints "STATUS BODY"
  python3 - "$1" "$URL$2" "$ADMIN_KEY" "$3" <<'PY'
import json, sys, urllib.request, urllib.error
method, url, key, body = sys.argv[1:5]
request = urllib.request.Request(url, data=body.encode(), method=method,
                                 headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    with opener.open(request, timeout=30) as answer:
        print(answer.status, answer.read().decode())
except urllib.error.HTTPError as error:
    print(error.code, error.read().decode())
PY
}
read -r st body < <(api POST /v1/spaces "{\"id\": \"$SPACE_ID\", \"name\": \"real SDK tests\"}")
case $st in 201|409) ;; *) die "creating space $SPACE_ID: $st $body";; esac
read -r st body < <(api POST /v1/keys "{\"space\": \"$SPACE_ID\", \"name\": \"realsdk-tests\", \"permissions\": [\"admin\", \"resource_config\", \"coordination_write\", \"coordination_read\"]}")
[ "$st" = 201 ] || die "creating key: $st $body"
KEY=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["key"])' "$body")

REALSDK_API_KEY=$KEY REALSDK_SPACE_ID=$SPACE_ID bash "$HERE/run.sh" "$VERSION" "$URL"
