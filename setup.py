"""setuptools' build script: the project's metadata is in pyproject.toml. What it adds: the core
(runstate_server/actors) compiled with mypyc when RUNSTATE_COMPILE=1 (_build_backend/runstate_build.py
puts mypy in the build's environment then; README, "A compiled core")."""

from __future__ import annotations

import os
import sys

from setuptools import setup

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "_build_backend"))
from runstate_build import compile_requested  # noqa: E402

# What is compiled: the deterministic core. Every module of it, since mypyc's calls between
# compiled modules are the fast ones.
COMPILED_PACKAGE = "runstate_server/actors"


def ext_modules() -> list:
    if not compile_requested():
        return []
    from mypyc.build import mypycify

    # MYPYC_OPT_LEVEL (mypyc's own setting, read by its command too) trades speed for build time:
    # the C compiler's -O3 takes about 2 minutes of CPU here, -O0 under one.
    return mypycify([COMPILED_PACKAGE], opt_level=os.environ.get("MYPYC_OPT_LEVEL", "3"), group_name="runstate_core")


setup(ext_modules=ext_modules())
