#!/usr/bin/env bash
# Regenerates the lock: requirements/*.txt, exact versions with every file's sha256
# (docs/development.md, "Dependencies and the lock"). From anywhere in the checkout:
#
#   requirements/refresh.sh                          keeps every locked version that pyproject.toml's
#                                                    ranges still allow; changes only what it must
#   requirements/refresh.sh --upgrade                the newest release of everything the ranges allow
#   requirements/refresh.sh --upgrade-package NAME   the newest NAME (repeatable), the rest kept
#
# Arguments go to `uv pip compile` of dev.txt. The lock is universal (`--universal`): one file for
# every platform and every Python from 3.10 (pyproject's requires-python), with environment markers
# where a dependency is only for some (tomli below 3.11). Sources, nothing else:
#   dev.txt     pyproject.toml's dependencies and its `dev` extra, sdk/python/pyproject.toml's
#               dependencies, and pyproject.toml's [build-system] requires (setuptools, wheel);
#   server.txt  the same without the `dev` extra (a node's runtime; the Docker image installs it);
#   build.txt   the [build-system] requires alone: installed first, so that building pysyncobj (an
#               sdist only) fetches nothing unlocked (`--no-build-isolation`).
# server.txt and build.txt take dev.txt's versions as constraints, so the three files agree.
# uv is installed with pip into a scratch venv (a temporary directory, removed at the end); the
# files install with plain pip: `pip install --require-hashes -r requirements/...`.
# Afterwards run compat/newest/run.sh and the tests (README) before the change lands.

set -euo pipefail
UV_VERSION=0.13.9
PYTHON=${PYTHON:-python3}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { echo "[refresh] $*" >&2; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/runstate-lock.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
log "uv $UV_VERSION into a scratch venv"
# -I: neither this checkout's .venv nor PYTHONPATH.
"$PYTHON" -I -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install --quiet --disable-pip-version-check "uv==$UV_VERSION" 'tomli>=2; python_version < "3.11"'
UV=$WORK/venv/bin/uv

cd "$ROOT"
# pyproject.toml's [build-system] requires, one a line (given to uv on its standard input: "-r -").
BUILD_REQUIRES=$("$WORK/venv/bin/python" -I -c '
import sys
try:
    import tomllib
except ImportError:
    import tomli as tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')

# --no-config: no uv.toml or pyproject [tool.uv] changes the resolution; uv asks its default
# index (PyPI) for the hashes of every file of each locked release.
compile() {
    UV_CUSTOM_COMPILE_COMMAND="requirements/refresh.sh" "$UV" pip compile --quiet --no-config \
        --universal --python-version 3.10 --generate-hashes "$@"
}
log "requirements/dev.txt"
compile pyproject.toml --extra dev sdk/python/pyproject.toml - -o requirements/dev.txt "$@" <<<"$BUILD_REQUIRES"
log "requirements/server.txt"
compile pyproject.toml sdk/python/pyproject.toml - -c requirements/dev.txt -o requirements/server.txt <<<"$BUILD_REQUIRES"
log "requirements/build.txt"
compile - -c requirements/dev.txt -o requirements/build.txt <<<"$BUILD_REQUIRES"
log "done: git diff requirements/ shows what changed"
