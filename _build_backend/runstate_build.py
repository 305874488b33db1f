"""The package's build backend: setuptools', plus the compiled core when it is asked for.

    RUNSTATE_COMPILE=1 pip install .

builds `runstate_server.actors` (the deterministic core every replica runs on every committed
command) with mypyc, from the same source, into C extension modules beside the .py files, which
Python then imports instead. It needs a C compiler and the Python headers; mypy (which carries
mypyc) is fetched into the build's own environment like setuptools. Without the variable the
package is pure Python, as before. See README, "A compiled core".

An editable install (`pip install -e .`) refuses it: compiled modules in the source tree would be
imported instead of every later edit of their .py files.
"""

from __future__ import annotations

import os
from typing import Any

from setuptools import build_meta
from setuptools.build_meta import (  # noqa: F401  (the rest of the backend, as setuptools has it)
    build_sdist,
    get_requires_for_build_sdist,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

# The variable that asks for the compiled core, and the values that mean yes.
COMPILE_ENV = "RUNSTATE_COMPILE"
COMPILE_YES = ("1", "true", "yes")
# mypyc ships with mypy; the release range the core is compiled and tested with.
MYPYC_REQUIREMENT = "mypy>=1.10,<3"


def compile_requested() -> bool:
    return os.environ.get(COMPILE_ENV, "").strip().lower() in COMPILE_YES


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    compiling = compile_requested()
    # setuptools runs setup.py to find what it needs, before mypy is there to import: it runs it
    # as the pure build here.
    saved = os.environ.pop(COMPILE_ENV, None)
    try:
        requires = list(build_meta.get_requires_for_build_wheel(config_settings))
    finally:
        if saved is not None:
            os.environ[COMPILE_ENV] = saved
    return [*requires, MYPYC_REQUIREMENT] if compiling else requires


def build_wheel(
    wheel_directory: str, config_settings: dict[str, Any] | None = None, metadata_directory: str | None = None
) -> str:
    return str(build_meta.build_wheel(wheel_directory, config_settings, metadata_directory))


def get_requires_for_build_editable(config_settings: dict[str, Any] | None = None) -> list[str]:
    _refuse_editable_compile()
    return list(build_meta.get_requires_for_build_editable(config_settings))


def build_editable(
    wheel_directory: str, config_settings: dict[str, Any] | None = None, metadata_directory: str | None = None
) -> str:
    _refuse_editable_compile()
    return str(build_meta.build_editable(wheel_directory, config_settings, metadata_directory))


def _refuse_editable_compile() -> None:
    if compile_requested():
        raise SystemExit(
            f"runstate: {COMPILE_ENV}=1 builds the compiled core for a regular install (pip install .), "
            "not an editable one: its compiled modules would be imported instead of every later edit "
            f"of their .py files. Unset {COMPILE_ENV} for an editable install."
        )
