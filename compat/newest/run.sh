#!/usr/bin/env bash
# The cluster's tests against the newest releases of our dependencies, not the lock's
# (docs/development.md, "Dependencies and the lock"). Not part of the default test run: it downloads the newest releases.
#
#   compat/newest/run.sh [--ranges]         the newest release of every dependency (runtime and dev
#                                           tools) that pyproject.toml's ranges allow
#   compat/newest/run.sh --unbounded        the newest release of every dependency with no version
#                                           bound at all (environment markers kept); the project
#                                           itself with --no-deps; RUNSTATE_ALLOW_UNTESTED_DEPENDENCIES=1
#                                           (the node warns of an untested pysyncobj or aiohttp
#                                           instead of refusing to start, and still checks each seam)
#   compat/newest/run.sh [MODE] -- ARGS...  pytest with these arguments too (-k, -x, other test files)
#
# From anywhere in the checkout. Builds a scratch venv in a temporary directory (removed at the end)
# from $PYTHON (python3 by default; never this checkout's .venv, and without PYTHONPATH), prints
# the release it got of each runtime dependency and dev tool beside the locked one
# (requirements/dev.txt), marking those that differ, and runs TESTS below in this checkout with the
# repository's pytest configuration (pyproject.toml).
# Exit status: pytest's; 1 when the venv cannot be built; 2 for a bad argument.

set -u -o pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PYTHON=${PYTHON:-python3}
log() { echo "[newest] $*" >&2; }
die() { echo "[newest] $*" >&2; exit 1; }

# The cluster (log, journal, transport, frame cipher, snapshots, elections), the node's HTTP server,
# and the checks of the seams where we reach into pysyncobj and aiohttp
# (test_dependency_seams.py, test_aiohttp_seams.py, ...).
TESTS=(tests/test_cluster_*.py tests/test_node_http_server.py)
for seams in "$ROOT"/tests/test_*seams.py; do [ -f "$seams" ] && TESTS+=("tests/${seams##*/}"); done

MODE=ranges
while [ $# -gt 0 ]; do
    case "$1" in
        --ranges) MODE=ranges; shift ;;
        --unbounded) MODE=unbounded; shift ;;
        --) shift; break ;;
        *) echo "usage: $0 [--ranges | --unbounded] [-- PYTEST-ARGS...]" >&2; exit 2 ;;
    esac
done

# Nothing of this checkout's environment: no PYTHONPATH, no activated .venv on PATH.
unset PYTHONPATH PYTHONHOME PYTHONSTARTUP PYTHONUSERBASE VIRTUAL_ENV
PATH=$(printf '%s' "$PATH" | tr ':' '\n' | grep -vxF "$ROOT/.venv/bin" | paste -sd: -)

WORK=$(mktemp -d "${TMPDIR:-/tmp}/runstate-newest.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
VENV=$WORK/venv
"$PYTHON" -I -m venv "$VENV" || die "cannot create a venv with $PYTHON"
PY=("$VENV/bin/python" -I)
PIP=("${PY[@]}" -m pip --disable-pip-version-check)
export PATH="$VENV/bin:$PATH"
cd "$ROOT" || die "no $ROOT"

started=$SECONDS
if [ "$MODE" = ranges ]; then
    log "installing the newest releases pyproject.toml's ranges allow (pip install --upgrade --upgrade-strategy eager)"
    "${PIP[@]}" install --quiet --upgrade pip >"$WORK/install.log" 2>&1
    "${PIP[@]}" install --quiet --upgrade --upgrade-strategy eager -e ".[dev]" -e ./sdk/python >>"$WORK/install.log" 2>&1 \
        || { tail -40 "$WORK/install.log" >&2; die "the install failed"; }
else
    log "installing the newest release of every dependency, with no version bound"
    # What reads pyproject.toml below (tomli below Python 3.11), itself unbounded.
    "${PIP[@]}" install --quiet --upgrade pip packaging 'tomli; python_version < "3.11"' >"$WORK/install.log" 2>&1 \
        || { tail -40 "$WORK/install.log" >&2; die "the install failed"; }
    "${PY[@]}" - >"$WORK/unbounded.txt" <<'PY' || die "cannot read pyproject.toml"
import sys
try:
    import tomllib
except ImportError:
    import tomli as tomllib
from packaging.requirements import Requirement

requirements = []
for path, extras in (("pyproject.toml", ("dev",)), ("sdk/python/pyproject.toml", ())):
    with open(path, "rb") as f:
        project = tomllib.load(f)["project"]
    requirements += project.get("dependencies", [])
    for extra in extras:
        requirements += project["optional-dependencies"][extra]
lines = {}  # each once (the server and the SDK both need anyio)
for text in requirements:
    r = Requirement(text)
    line = r.name + (f"[{','.join(sorted(r.extras))}]" if r.extras else "")
    lines[line + (f"; {r.marker}" if r.marker else "")] = None
print("\n".join(lines))
PY
    log "unbounded: $(paste -sd' ' "$WORK/unbounded.txt")"
    "${PIP[@]}" install --quiet --upgrade --upgrade-strategy eager -r "$WORK/unbounded.txt" >>"$WORK/install.log" 2>&1 \
        || { tail -40 "$WORK/install.log" >&2; die "the install failed"; }
    "${PIP[@]}" install --quiet --no-deps -e . -e ./sdk/python >>"$WORK/install.log" 2>&1 \
        || { tail -40 "$WORK/install.log" >&2; die "the install of the project failed"; }
    export RUNSTATE_ALLOW_UNTESTED_DEPENDENCIES=1
fi
log "installed in $((SECONDS - started)) s"
# pip's own word on whether the set holds together (in --unbounded, a release past a range is expected).
"${PIP[@]}" check >&2 || log "pip check found the above (mode $MODE)"

# Each runtime dependency and dev tool: the release in the venv, the locked one, * where they differ.
"${PY[@]}" - "$MODE" <<'PY' || die "cannot list the releases"
import re
import sys
from importlib import metadata

try:
    import tomllib
except ImportError:
    import tomli as tomllib
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

locked = {}
entry = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$")
for line in open("requirements/dev.txt"):
    m = entry.match(line)
    if m and (m.group(3) is None or Marker(m.group(3)).evaluate()):
        locked[canonicalize_name(m.group(1))] = m.group(2)

rows = []
for path, groups in (("pyproject.toml", (("runtime", None), ("dev", "dev"))), ("sdk/python/pyproject.toml", (("sdk", None),))):
    with open(path, "rb") as f:
        project = tomllib.load(f)["project"]
    for kind, extra in groups:
        for text in project["optional-dependencies"][extra] if extra else project["dependencies"]:
            r = Requirement(text)
            if r.marker and not r.marker.evaluate():
                continue
            name = canonicalize_name(r.name)
            if any(row[1] == name for row in rows):
                continue
            try:
                used = metadata.version(r.name)
            except metadata.PackageNotFoundError:
                used = "(none)"
            lock = locked.get(name, "(not locked)")
            rows.append((kind, name, str(r.specifier) or "any", used, lock, "*" if used != lock else ""))
differ = sum(1 for row in rows if row[5])
print(f"[newest] mode {sys.argv[1]}, Python {sys.version.split()[0]}: {differ} of {len(rows)} differ from requirements/dev.txt (*)")
header = ("kind", "package", "range", "used", "locked", "")
widths = [max(len(str(row[i])) for row in (header, *rows)) for i in range(6)]
for row in (header, *rows):
    print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())
# What they pulled in: each other locked package whose release here differs, or that the lock lacks
# (not the venv's own pip and setuptools, nor the project).
direct = {row[1] for row in rows} | {"pip", "setuptools", "wheel", "runstate-server", "runstate-sdk"}
others = []
for dist in metadata.distributions():
    name = canonicalize_name(dist.metadata["Name"])
    if name not in direct and locked.get(name) != dist.version:
        others.append(f"{name} {dist.version} (locked {locked.get(name, 'no')})")
print("[newest] their dependencies that differ from the lock: " + (", ".join(sorted(others)) or "none"))
PY

log "pytest ${TESTS[*]} $*"
"${PY[@]}" -m pytest -p no:cacheprovider "${TESTS[@]}" "$@" 2>&1 | tee "$WORK/pytest.log"
status=${PIPESTATUS[0]}
summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed|errors?|skipped|deselected)|no tests ran' "$WORK/pytest.log" | tail -n 1 | sed -E 's/^=+ //; s/ =+$//')
log "mode $MODE: ${summary:-no pytest summary} (exit $status)"
exit "$status"
