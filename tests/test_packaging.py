"""The server and the SDK are two distributions: the server's wheel holds `runstate_server` only
(console script `runstate`), the SDK's holds `runstate` only, so either SDK, ours or the published
one, installs beside the server in one environment."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PIP_TIMEOUT_S = 600

pytestmark = pytest.mark.slow


# A new environment's own: what this run's PYTHONPATH holds (compat/compiled/run.sh puts a checkout
# there) would tell its pip the server is installed already, and its scripts would import that.
ISOLATED_ENV = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}


def pip(python: Path | str, *args: str) -> None:
    subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", "-q", *args], check=True, timeout=PIP_TIMEOUT_S,
        env=ISOLATED_ENV,
    )


def top_level(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return {name.split("/", 1)[0] for name in archive.namelist() if not name.split("/", 1)[0].endswith(".dist-info")}


def source_copy(to: Path) -> Path:
    """The checkout's files (those git tracks, and new ones it does not ignore) copied to `to`: a
    wheel is built there, so that two test workers building at once never share a `build/` folder
    in the checkout."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True,
        check=True, timeout=60,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():  # a file deleted but not yet committed is left out
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name)
    return to


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    source = source_copy(tmp_path_factory.mktemp("source"))
    pip(sys.executable, "wheel", "--no-deps", "-w", str(out), str(source), str(source / "sdk" / "python"))
    (server,) = out.glob("runstate_server-*.whl")
    (sdk,) = out.glob("runstate_sdk-*.whl")
    return {"server": server, "sdk": sdk}


def test_each_wheel_holds_one_package(wheels: dict[str, Path]) -> None:
    assert top_level(wheels["server"]) == {"runstate_server"}
    assert top_level(wheels["sdk"]) == {"runstate"}


def test_the_server_wheel_holds_the_consoles_built_files(wheels: dict[str, Path]) -> None:
    static = ROOT / "runstate_server" / "console" / "static"
    with zipfile.ZipFile(wheels["server"]) as archive:
        for name in ("index.html", "app.js", "app.css"):
            assert archive.read(f"runstate_server/console/static/{name}") == (static / name).read_bytes()


def test_the_published_sdk_installs_beside_the_server(wheels: dict[str, Path], tmp_path: Path) -> None:
    venv.create(tmp_path / "env", with_pip=True)
    python = tmp_path / "env" / "bin" / "python"
    pip(python, "install", str(wheels["server"]), "runstate-sdk==0.3.0")
    version = subprocess.run(
        [str(tmp_path / "env" / "bin" / "runstate"), "--version"], capture_output=True, text=True, check=True, timeout=60,
        env=ISOLATED_ENV,
    )
    assert version.stdout.startswith("runstate ")
    found = subprocess.run(
        [str(python), "-I", "-c", "import importlib.metadata as m, runstate; print(m.version('runstate-sdk'), runstate.__file__)"],
        capture_output=True, text=True, check=True, timeout=60, env=ISOLATED_ENV,
    ).stdout.split()
    assert found[0] == "0.3.0" and "site-packages" in found[1]
    # And the server does not need the SDK: its admin commands run without ours.
    usage = subprocess.run([str(tmp_path / "env" / "bin" / "runstate"), "keys", "list", "--url", "ftp://x"],
                           capture_output=True, text=True, timeout=60, env=ISOLATED_ENV)
    assert usage.returncode == 2 and "--url" in usage.stderr


def test_the_default_wheel_is_pure_python(wheels: dict[str, Path]) -> None:
    """Without RUNSTATE_COMPILE the server's wheel holds no compiled module (README, "A compiled core")."""
    assert wheels["server"].name.endswith("-py3-none-any.whl"), wheels["server"].name
    with zipfile.ZipFile(wheels["server"]) as archive:
        assert not [name for name in archive.namelist() if name.endswith((".so", ".pyd", ".c"))]


def backend_call(hook: str, compile_value: str | None) -> subprocess.CompletedProcess[str]:
    """One hook of the project's build backend, as pip calls it from the project's root."""
    env = {name: value for name, value in os.environ.items() if name != "RUNSTATE_COMPILE"}
    if compile_value is not None:
        env["RUNSTATE_COMPILE"] = compile_value
    code = f"import sys; sys.path.insert(0, '_build_backend'); import runstate_build as b; print(b.{hook}())"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_the_build_fetches_mypy_only_for_a_compiled_core() -> None:
    pure = backend_call("get_requires_for_build_wheel", None)
    compiled = backend_call("get_requires_for_build_wheel", "1")
    assert pure.returncode == 0 and compiled.returncode == 0, pure.stderr + compiled.stderr
    assert "mypy" not in pure.stdout and "'mypy>=" in compiled.stdout, (pure.stdout, compiled.stdout)
    assert "'mypy>=" not in backend_call("get_requires_for_build_wheel", "0").stdout


def test_an_editable_install_refuses_the_compiled_core() -> None:
    refused = backend_call("get_requires_for_build_editable", "yes")
    assert refused.returncode != 0 and "editable" in refused.stderr and "RUNSTATE_COMPILE" in refused.stderr, refused.stderr
    assert backend_call("get_requires_for_build_editable", None).returncode == 0
