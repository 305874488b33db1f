#!/usr/bin/env bash
# Run the integration tests of a published runstate-sdk release (PyPI) against a runstate server.
#
#   run.sh VERSION [BASE_URL]        e.g.  run.sh 0.3.0      run.sh 0.2.0 http://127.0.0.1:8080
#
# Run it from the root of a checkout of the project (or set RUNSTATE_SERVER_CMD). Only 0.2.0 and
# 0.3.0 ship tests in their sdists. The releases are downloaded from PyPI when it runs; nothing of
# theirs is kept in the project. tests/test_realsdk.py runs it; docs/development.md
# ("Compatibility with the published clients") says how to run it by hand.
#
# - keeps a cache, $RUNSTATE_REALSDK_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/runstate-realsdk):
#   `pip download`s the release's wheel and sdist into dist/ if they are missing, unpacks the sdist
#   into sdist/, and makes (once) a venv for that release in venv-VERSION: the wheel, pytest,
#   pytest-asyncio, pytest-timeout, anyio, httpx;
# - copies the sdist's tests into a fresh scratch folder (mktemp; under $RUNSTATE_REALSDK_RUNS if
#   set), with the conftest.py next to this script and a pytest.ini (asyncio_mode=auto, per-test
#   timeout);
# - without BASE_URL: starts the project's server, `$RUNSTATE_SERVER_CMD dev --auth` (default: the
#   `runstate` on PATH, else ./.venv/bin/runstate), on a free 127.0.0.1 port with a fresh data dir,
#   takes the bootstrap admin key it writes, creates the space the tests use ($REALSDK_SPACE_ID,
#   default "realsdk") and a key for it with every permission, through /v1/spaces and /v1/keys;
#   with BASE_URL: uses REALSDK_API_KEY and REALSDK_SPACE_ID from the environment;
# - runs pytest (per-test timeout REALSDK_TEST_TIMEOUT, default 60 s; whole run bounded by
#   REALSDK_TOTAL_TIMEOUT, default 1800 s), prints a summary (counts, and the first failure per
#   file), and stops the server it started, by PID. Nothing it started is left running, also when
#   it is interrupted.
#
# Environment: RUNSTATE_REALSDK_CACHE, RUNSTATE_REALSDK_RUNS (parent folder of the scratch folders;
# default: a mktemp folder under $TMPDIR), RUNSTATE_SERVER_CMD (the server command, split on spaces),
# REALSDK_SPACE_ID, REALSDK_API_KEY (with BASE_URL), REALSDK_FIXTURES (a copy of the hosted
# product's tests/fixtures/sdk-conformance, if you have one), REALSDK_PYTEST_ARGS (extra pytest
# arguments, e.g. "-k once"), REALSDK_TEST_TIMEOUT, REALSDK_TOTAL_TIMEOUT.
# Outputs, kept in the scratch folder: pytest.log, junit.xml, results.tsv, counts.txt, summary.txt,
# server.log. Exit status: 0 when pytest ran (whatever its result: read summary.txt or counts.txt),
# 1 when the setup failed, 2 on bad usage.

set -u -o pipefail

usage() { echo "usage: $0 VERSION [BASE_URL]" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
VERSION=$1
BASE_URL=${2:-}
case $VERSION in *[!0-9A-Za-z.+-]*|'') usage;; esac

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${RUNSTATE_REALSDK_CACHE:-${XDG_CACHE_HOME:-${HOME:?set HOME or RUNSTATE_REALSDK_CACHE}/.cache}/runstate-realsdk}
DIST=$CACHE/dist
SRC=$CACHE/sdist/runstate_sdk-$VERSION
VENV=$CACHE/venv-$VERSION
SPACE_ID=${REALSDK_SPACE_ID:-realsdk}
PER_TEST_TIMEOUT=${REALSDK_TEST_TIMEOUT:-60}
TOTAL_TIMEOUT=${REALSDK_TOTAL_TIMEOUT:-1800}

log() { echo "[run.sh] $*" >&2; }
die() { echo "[run.sh] $*" >&2; exit 1; }

# --- cleanup: whatever this script started is stopped by PID --------------------------------
CHILD=         # the foreground step (pip, pytest), run in the background so a signal is seen at once
SERVER_PID=
stop_pid() {  # stop_pid PID NAME: SIGTERM, up to 10 s, then SIGKILL
  local pid=$1 name=$2
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    log "$name $pid ignored SIGTERM; SIGKILL"
    kill -KILL "$pid" 2>/dev/null
  fi
  wait "$pid" 2>/dev/null
  log "$name $pid stopped"
}
stop_server() { stop_pid "$SERVER_PID" server; SERVER_PID=; }
cleanup() { stop_pid "$CHILD" "step"; CHILD=; stop_server; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
step() {  # step LOG CMD...: runs CMD, its output to LOG (- keeps this output), interruptible by a signal
  local out=$1; shift
  if [ "$out" = - ]; then "$@" & else "$@" >"$out" 2>&1 & fi
  CHILD=$!
  wait "$CHILD"
  local rc=$?
  CHILD=
  return $rc
}

# --- the server command (only needed without BASE_URL; resolved before any cd) ----------------
SERVER_CMD=()
if [ -z "$BASE_URL" ]; then
  if [ -n "${RUNSTATE_SERVER_CMD:-}" ]; then
    read -r -a SERVER_CMD <<<"$RUNSTATE_SERVER_CMD"
  elif command -v runstate >/dev/null 2>&1; then
    SERVER_CMD=("$(command -v runstate)")
  elif [ -x .venv/bin/runstate ]; then
    SERVER_CMD=("$PWD/.venv/bin/runstate")
  else
    die "no server command: set RUNSTATE_SERVER_CMD, put runstate on PATH, or run from the project's root after the README's set-up command (Set up: it installs .venv from the lock)"
  fi
fi

# --- the cache: wheel, sdist, the release's venv -------------------------------------------------
mkdir -p "$DIST" "$CACHE/sdist" || die "cannot create the cache $CACHE"
if command -v flock >/dev/null 2>&1; then  # two runs of one version share the cache safely
  exec 9>"$CACHE/.lock-$VERSION"
  flock -w 1800 9 || die "cache $CACHE is locked by another run of $VERSION"
fi

sha256() { python3 -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' "$1"; }
find_wheel() { ls "$DIST"/runstate_sdk-"$VERSION"-*.whl 2>/dev/null | head -n 1; }
SDIST=$DIST/runstate_sdk-$VERSION.tar.gz

venv_ok() { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import sys' 2>/dev/null; }
if ! venv_ok; then
  log "creating $VENV"
  rm -rf "$VENV" "$CACHE/.stamp-$VERSION"
  step - timeout 600 python3 -m venv "$VENV" || die "python3 -m venv $VENV failed"
fi
# -I: the current directory (e.g. the project's root, with its own runstate_sdk.egg-info) stays off sys.path.
PIP=("$VENV/bin/python" -I -m pip --disable-pip-version-check)

download() {  # download KIND: fetches the wheel (binary) or the sdist (source) of VERSION into $DIST
  local kind=$1 tmp
  tmp=$(mktemp -d "$DIST/.download.XXXXXX") || return 1
  local how=(--only-binary :all:)
  [ "$kind" = sdist ] && how=(--no-binary :all:)
  log "pip download ($kind) runstate-sdk==$VERSION"
  if ! step "$CACHE/download-$VERSION-$kind.log" \
      timeout 600 "${PIP[@]}" download -q --no-deps "${how[@]}" -d "$tmp" "runstate-sdk==$VERSION"; then
    rm -rf "$tmp"; die "pip download of the $kind of runstate-sdk $VERSION failed, see $CACHE/download-$VERSION-$kind.log"
  fi
  local got
  if [ "$kind" = sdist ]; then
    got=$(ls "$tmp"/*.tar.gz 2>/dev/null | head -n 1)
    [ -n "$got" ] || { rm -rf "$tmp"; die "no .tar.gz sdist came down for $VERSION"; }
    mv -f "$got" "$SDIST"
  else
    got=$(ls "$tmp"/*.whl 2>/dev/null | head -n 1)
    [ -n "$got" ] || { rm -rf "$tmp"; die "no wheel came down for $VERSION"; }
    mv -f "$got" "$DIST/"
  fi
  rm -rf "$tmp"
}

[ -n "$(find_wheel)" ] || download wheel
WHEEL=$(find_wheel)
[ -n "$WHEEL" ] || die "no wheel of runstate-sdk $VERSION in $DIST"
[ -f "$SDIST" ] || download sdist

if [ ! -d "$SRC/tests" ]; then
  tmp=$(mktemp -d "$CACHE/sdist/.unpack.XXXXXX") || die "mktemp failed"
  tar -xzf "$SDIST" -C "$tmp" || { rm -rf "$tmp"; die "cannot unpack $SDIST"; }
  top=$(ls -d "$tmp"/*/ 2>/dev/null | head -n 1)
  [ -n "$top" ] && [ -d "$top/tests" ] || { rm -rf "$tmp"; die "the sdist of $VERSION has no tests/ (only 0.2.0 and 0.3.0 ship tests)"; }
  rm -rf "$SRC"
  mv "${top%/}" "$SRC"
  rm -rf "$tmp"
  log "unpacked the sdist's tests into $SRC/tests"
fi

WHEEL_SUM=$(sha256 "$WHEEL")
if [ "$(cat "$CACHE/.stamp-$VERSION" 2>/dev/null)" != "$WHEEL_SUM" ]; then
  log "installing $(basename "$WHEEL") and the test tools into $VENV"
  step "$VENV.install.log" timeout 900 "${PIP[@]}" install -q "$WHEEL" pytest pytest-asyncio pytest-timeout anyio httpx \
    || die "pip install failed, see $VENV.install.log"
  echo "$WHEEL_SUM" >"$CACHE/.stamp-$VERSION"
fi
GOT=$("$VENV/bin/python" -I -c 'import importlib.metadata as m; print(m.version("runstate-sdk"))')
[ "$GOT" = "$VERSION" ] || die "$VENV has runstate-sdk $GOT, not $VERSION"
exec 9>&-  # the cache is ready: release the lock (runs of one version may test concurrently)

# --- scratch copy of the tests ---------------------------------------------------------------
if [ -n "${RUNSTATE_REALSDK_RUNS:-}" ]; then
  mkdir -p "$RUNSTATE_REALSDK_RUNS" || die "cannot create $RUNSTATE_REALSDK_RUNS"
  WORK=$(mktemp -d "$RUNSTATE_REALSDK_RUNS/run-$VERSION.XXXXXX") || die "mktemp failed"
else
  WORK=$(mktemp -d -t "runstate-realsdk-$VERSION.XXXXXX") || die "mktemp failed"
fi
mkdir -p "$WORK/sdk"
cp -r "$SRC/tests" "$WORK/sdk/tests"
find "$WORK/sdk/tests" -name __pycache__ -prune -exec rm -rf {} +
# test_cross_language does `from .conftest import ...`: the folder is a package in the product repo.
[ -f "$WORK/sdk/tests/__init__.py" ] || : >"$WORK/sdk/tests/__init__.py"
cp "$HERE/conftest.py" "$WORK/sdk/tests/conftest.py"
# test_cross_language loads the TypeScript SDK from <repo root>/packages/sdk-typescript/dist: ours
# is sdk/typescript of this checkout, once built (npm ci && npm run build there; the test suite's
# tests/test_realsdk.py builds it first).
if [ -z "${REALSDK_REPO_ROOT:-}" ] && [ -f "$HERE/../../sdk/typescript/dist/index.js" ]; then
  mkdir -p "$WORK/repo/packages"
  ln -sfn "$(cd "$HERE/../../sdk/typescript" && pwd)" "$WORK/repo/packages/sdk-typescript"
  export REALSDK_REPO_ROOT="$WORK/repo"
fi
cat >"$WORK/sdk/pytest.ini" <<EOF
[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
testpaths = tests
timeout = $PER_TEST_TIMEOUT
timeout_method = signal
addopts = -ra -p no:cacheprovider
EOF
if [ -n "${REALSDK_FIXTURES:-}" ]; then
  mkdir -p "$WORK/tests/fixtures"
  cp -r "$REALSDK_FIXTURES" "$WORK/tests/fixtures/sdk-conformance"
fi
log "scratch folder $WORK"

# --- the server ------------------------------------------------------------------------------
http() {  # http METHOD URL KEY [JSON] -> prints "STATUS BODY"
  python3 - "$@" <<'PY'
import json, sys, urllib.request, urllib.error
method, url, key = sys.argv[1:4]
data = sys.argv[4].encode() if len(sys.argv) > 4 else None
req = urllib.request.Request(url, data=data, method=method)
req.add_header("authorization", f"Bearer {key}")
if data is not None:
    req.add_header("content-type", "application/json")
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    with opener.open(req, timeout=10) as r:
        print(r.status, r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
PY
}

OURS=
if [ -z "$BASE_URL" ]; then
  OURS=1
  # A port below Linux's ephemeral range (the tests' nodes pick theirs there too): one the kernel
  # picks could go to another process's outgoing connection before the server binds it.
  PORT=$(python3 -c '
import random, socket
for port in random.SystemRandom().sample(range(20000, 30000), 500):
    try:
        socket.socket().bind(("127.0.0.1", port))
    except OSError:
        continue
    print(port)
    break
')
  [ -n "$PORT" ] || { echo "no free port in 20000-30000 after 500 tries" >&2; exit 1; }
  BASE_URL=http://127.0.0.1:$PORT
  DATA=$WORK/data
  # The bootstrap key comes from DATA/bootstrap.key: an inherited RUNSTATE_BOOTSTRAP_KEY would replace it.
  env -u RUNSTATE_BOOTSTRAP_KEY "${SERVER_CMD[@]}" dev --auth --host 127.0.0.1 --port "$PORT" --data-dir "$DATA" \
    >"$WORK/server.log" 2>&1 </dev/null &
  SERVER_PID=$!
  log "started the server (${SERVER_CMD[*]}), pid $SERVER_PID, at $BASE_URL (log $WORK/server.log)"
  up=
  for _ in $(seq 1 120); do
    kill -0 "$SERVER_PID" 2>/dev/null || { cat "$WORK/server.log" >&2; die "the server exited"; }
    if [ -s "$DATA/bootstrap.key" ] &&
       [ "$(curl --noproxy '*' -s -o /dev/null -w '%{http_code}' "$BASE_URL/v1/health")" = 200 ]; then up=1; break; fi
    sleep 0.25
  done
  [ -n "$up" ] || { cat "$WORK/server.log" >&2; die "the server was not healthy in 30 s"; }
  ADMIN_KEY=$(cat "$DATA/bootstrap.key")
  # The space the tests address in their paths, and a key of that space with every permission.
  read -r st body < <(http POST "$BASE_URL/v1/spaces" "$ADMIN_KEY" "{\"id\": \"$SPACE_ID\", \"name\": \"real SDK tests\"}")
  case $st in 201|409) ;; *) die "creating space $SPACE_ID: $st $body";; esac
  read -r st body < <(http POST "$BASE_URL/v1/keys" "$ADMIN_KEY" "{\"space\": \"$SPACE_ID\", \"name\": \"realsdk-tests\", \"permissions\": [\"admin\", \"resource_config\", \"coordination_write\", \"coordination_read\"]}")
  [ "$st" = 201 ] || die "creating key: $st $body"
  API_KEY=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["key"])' "$body")
  log "space $SPACE_ID and its key created"
else
  BASE_URL=${BASE_URL%/}
  API_KEY=${REALSDK_API_KEY:-}
  [ -n "$API_KEY" ] || { echo "with BASE_URL, set REALSDK_API_KEY (and REALSDK_SPACE_ID, default realsdk)" >&2; exit 2; }
fi

# --- the tests -------------------------------------------------------------------------------
log "pytest: runstate-sdk $VERSION against $BASE_URL, space $SPACE_ID"
cd "$WORK/sdk" || exit 1
NOPROXY=()  # our own server is on 127.0.0.1: never through a proxy
[ -n "$OURS" ] && NOPROXY=(NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}" no_proxy="127.0.0.1,localhost${no_proxy:+,$no_proxy}")
# shellcheck disable=SC2086
step "$WORK/pytest.log" env -u RUNSTATE_API_KEY -u RUNSTATE_SPACE_ID -u RUNSTATE_BASE_URL -u RUNSTATE_RUN -u RUNSTATE_SCOPE_ID \
  -u PYTHONPATH ${NOPROXY[@]+"${NOPROXY[@]}"} \
  REALSDK_BASE_URL="$BASE_URL" REALSDK_API_KEY="$API_KEY" REALSDK_SPACE_ID="$SPACE_ID" PYTHONDONTWRITEBYTECODE=1 \
  timeout --kill-after=15 "$TOTAL_TIMEOUT" "$VENV/bin/python" -m pytest -q --junitxml="$WORK/junit.xml" \
  ${REALSDK_PYTEST_ARGS:-} tests
PYTEST_RC=$?
tail -n 60 "$WORK/pytest.log"
[ "$PYTEST_RC" = 124 ] && log "pytest ran past REALSDK_TOTAL_TIMEOUT ($TOTAL_TIMEOUT s) and was stopped"

stop_server

# --- summary ---------------------------------------------------------------------------------
python3 - "$WORK" "$VERSION" "$BASE_URL" "$PYTEST_RC" <<'PY' | tee "$WORK/summary.txt"
import sys, xml.etree.ElementTree as ET
from collections import OrderedDict
work, version, base_url, rc = sys.argv[1:5]
try:
    root = ET.parse(f"{work}/junit.xml").getroot()
except Exception as e:  # noqa: BLE001
    print(f"no junit.xml ({e}); pytest exit status {rc}; see {work}/pytest.log")
    sys.exit(0)
counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
per_file = OrderedDict()
rows = []
for tc in root.iter("testcase"):
    cls = tc.get("classname") or ""
    name = tc.get("name") or ""
    f = (cls.split(".")[1] if cls.startswith("tests.") else cls or name).split("::")[0] or name
    if f.startswith("tests."):
        f = f.split(".", 1)[1]
    outcome, msg = "passed", ""
    for child in tc:
        if child.tag in ("failure", "error", "skipped"):
            outcome = {"failure": "failed", "error": "errors", "skipped": "skipped"}[child.tag]
            msg = child.get("message") or ""
            if not msg or msg == "collection skipped":
                msg = child.text or msg
            msg = msg.strip().splitlines()
            msg = msg[0] if msg else ""
            break
    counts[outcome] += 1
    d = per_file.setdefault(f, {"passed": 0, "failed": 0, "skipped": 0, "errors": 0, "first": None})
    d[outcome] += 1
    if outcome in ("failed", "errors") and d["first"] is None:
        d["first"] = f"{name}: {msg[:300]}"
    rows.append((f, name, outcome, msg[:300].replace("\t", " ")))
with open(f"{work}/results.tsv", "w") as out:
    for r in rows:
        out.write("\t".join(r) + "\n")
with open(f"{work}/counts.txt", "w") as out:
    out.write(" ".join(f"{k}={v}" for k, v in counts.items()) + f" pytest_rc={rc}\n")
print(f"runstate-sdk {version} against {base_url} (pytest exit status {rc})")
print("  " + ", ".join(f"{v} {k}" for k, v in counts.items()))
for f, d in per_file.items():
    print(f"  {f}: {d['passed']} passed, {d['failed']} failed, {d['skipped']} skipped, {d['errors']} errors")
    if d["first"]:
        print(f"    first failure: {d['first']}")
print(f"  details: {work}/pytest.log, {work}/results.tsv")
PY
exit 0
