#!/usr/bin/env bash
# Run tests against the compiled core (README, "A compiled core"):
#
#   compat/compiled/run.sh              the short form (CI runs it: tests/test_compiled_core.py): the
#                                       core's own tests (its model of tasks and runs, snapshots,
#                                       determinism), the replicated log's, a node's API (SHORT)
#   compat/compiled/run.sh --full       the whole suite
#   compat/compiled/run.sh -- ARGS...   pytest with these arguments instead (test files, -k, ...)
#
# From the project's root. Copies this checkout (tracked and new files, as they are now) to a
# temporary directory, builds its wheel there as a user would (`RUNSTATE_COMPILE=1 pip wheel`),
# unpacks the wheel over the copy's source so that its tests import the compiled modules (and the
# nodes they start: PYTHONPATH), checks that they do, and runs pytest in the copy with this
# checkout's .venv (README's test command installs it). MYPYC_OPT_LEVEL is mypyc's own setting
# (3 by default; 0 builds in half the time, into slower code that behaves the same).
# Exit status: pytest's; 1 when the build fails or the core is not compiled; 2 for a bad argument.

set -u -o pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
log() { echo "[compiled] $*" >&2; }
die() { echo "[compiled] $*" >&2; exit 1; }

# The short form: every test of the core but the long model runs of its resources, groups, access,
# once, permits, allowances, budgets, work limits and named barriers and timers (the core's own
# model, of tasks and runs, stays), the replicated log's, and a real node's API and batch tests.
SHORT=(
    tests/test_actors_*.py
    tests/test_cluster_log.py tests/test_cluster_snapshot.py tests/test_cluster_dump.py
    tests/test_node_api.py tests/test_sdk_batch.py
    -k "not model or core_against_the_model"
)
case "${1:-}" in
    "") TESTS=("${SHORT[@]}") ;;
    --full) TESTS=(--ignore=tests/test_compiled_core.py) ;;  # that test runs this script
    --) shift; TESTS=("$@") ;;
    *) echo "usage: $0 [--full | -- PYTEST-ARGS...]" >&2; exit 2 ;;
esac
[ -x "$PYTHON" ] || die "no $PYTHON: run the README's test command first (it makes .venv), or set PYTHON"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/runstate-compiled.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
COPY=$WORK/src
mkdir -p "$COPY"
# (A file deleted but not yet committed is left out: tar warns of it and goes on.)
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
    | tar --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C "$COPY") || die "could not copy the checkout"

log "building the wheel with RUNSTATE_COMPILE=1 (MYPYC_OPT_LEVEL=${MYPYC_OPT_LEVEL:-3})"
started=$SECONDS
RUNSTATE_COMPILE=1 "$PYTHON" -m pip wheel --quiet --no-deps -w "$WORK/wheel" "$COPY" >"$WORK/build.log" 2>&1 \
    || { tail -40 "$WORK/build.log" >&2; die "the build failed"; }
WHEEL=$(ls "$WORK"/wheel/runstate_server-*.whl) || die "no wheel"
log "built $(basename "$WHEEL") in $((SECONDS - started)) s"
"$PYTHON" -m zipfile -e "$WHEEL" "$COPY" || die "could not unpack $WHEEL"
# Its metadata goes, and the build's (egg-info, build/): on PYTHONPATH either would tell pip (a
# test's own venv) that the server is installed.
rm -rf "$COPY"/runstate_server-*.dist-info "$COPY"/*.egg-info "$COPY"/build

cd "$COPY" || die "no $COPY"
export PYTHONPATH=$COPY${PYTHONPATH:+:$PYTHONPATH}
"$PYTHON" -c 'import sys, runstate_server.actors as a, runstate_server.actors.tasks as t
print("[compiled] core:", t.__file__, file=sys.stderr); sys.exit(0 if a.COMPILED and t.__file__.endswith(".so") else 1)' \
    || die "the copy's core is not compiled"
"$PYTHON" -m pytest -p no:cacheprovider -q "${TESTS[@]}"
