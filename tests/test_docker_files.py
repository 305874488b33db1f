"""docker/: the image and the three-node compose file, checked without a Docker engine.

compose.yml is read with a small parser for the YAML it uses (block mappings and sequences,
quoted and plain scalars, JSON-style flow sequences, one anchor merged with `<<:`), so these
checks run everywhere; PyYAML is not a dependency."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parent.parent
DOCKER = ROOT / "docker"
COMPOSE_TEXT = (DOCKER / "compose.yml").read_text()
DOCKERFILE_TEXT = (DOCKER / "Dockerfile").read_text()
SECRET_VARIABLE = "RUNSTATE_CLUSTER_SECRET"
BOOTSTRAP_KEY_VARIABLE = "RUNSTATE_BOOTSTRAP_KEY"
API_PORT, RAFT_PORT = "8080", "9000"
HELP_TIMEOUT_S = 60


# -- compose.yml -----------------------------------------------------------------------------------


def _scalar(text: str) -> Any:
    text = text.strip()
    if text.startswith("["):
        return json.loads(text)
    if text.startswith('"'):
        return json.loads(text)
    if text.startswith("'"):
        assert text.endswith("'"), text
        return text[1:-1].replace("''", "'")
    return re.sub(r"\s+#.*$", "", text)


def parse_compose(text: str) -> dict[str, Any]:
    lines = [
        (len(line) - len(line.lstrip(" ")), line.strip())
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    anchors: dict[str, Any] = {}

    def block(i: int, indent: int) -> tuple[Any, int]:
        if lines[i][1].startswith("- "):
            items = []
            while i < len(lines) and lines[i][0] == indent and lines[i][1].startswith("- "):
                items.append(_scalar(lines[i][1][2:]))
                i += 1
            return items, i
        mapping: dict[str, Any] = {}
        merged: dict[str, Any] = {}
        while i < len(lines) and lines[i][0] == indent:
            key, _, rest = lines[i][1].partition(":")
            rest = rest.strip()
            assert key and not key.startswith("- "), f"unexpected line {lines[i][1]!r}"
            i += 1
            anchor = None
            if rest.startswith("&"):
                anchor, rest = rest[1:], ""
            if key == "<<":
                assert rest.startswith("*"), rest
                merged.update(anchors[rest[1:]])
                continue
            if rest:
                value = _scalar(rest)
            elif i < len(lines) and lines[i][0] > indent:
                value, i = block(i, lines[i][0])
            else:
                value = None
            if anchor:
                anchors[anchor] = value
            mapping[key] = value
        return {**merged, **mapping}, i

    document, end = block(0, 0)
    assert end == len(lines), f"could not read compose.yml past {lines[end][1]!r}"
    return document


COMPOSE = parse_compose(COMPOSE_TEXT)
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]


def node_flags(service: dict[str, Any]) -> dict[str, list[str]]:
    """The service's `runstate node` command as {flag: [values]}."""
    command = service["command"]
    assert isinstance(command, list) and command[0] == "node", command
    flags: dict[str, list[str]] = {}
    args = iter(command[1:])
    for arg in args:
        assert arg.startswith("--"), f"unexpected argument {arg!r} in {command}"
        flag, has_value, value = arg.partition("=")
        flags.setdefault(flag, []).append(value if has_value else next(args))
    return flags


def one(flags: dict[str, list[str]], flag: str) -> str:
    assert len(flags.get(flag, [])) == 1, f"{flag} given {len(flags.get(flag, []))} times"
    return flags[flag][0]


def test_the_compose_parser_reads_the_anchor_and_the_lists() -> None:
    assert set(COMPOSE) == {"name", "x-node", "services", "volumes"}
    assert SERVICES["n1"]["build"] == {"context": "..", "dockerfile": "docker/Dockerfile"}
    assert SERVICES["n1"]["healthcheck"]["test"][0] == "CMD"
    assert SERVICES["n1"]["command"][:3] == ["node", "--node-id", "n1"]


# The nodes of the first configuration, and the one that joins later (profile "join").
SEEDS = {name: service for name, service in SERVICES.items() if "profiles" not in service}
JOINERS = {name: service for name, service in SERVICES.items() if "profiles" in service}


def test_three_nodes_built_from_the_repository() -> None:
    assert sorted(SEEDS) == ["n1", "n2", "n3"] and sorted(JOINERS) == ["n4"]
    for name, service in SERVICES.items():
        assert service["build"] == {"context": "..", "dockerfile": "docker/Dockerfile"}, name
        assert service["restart"] == "unless-stopped", name
        assert one(node_flags(service), "--node-id") == name


def test_each_node_binds_and_advertises_its_own_addresses() -> None:
    for name, service in SERVICES.items():
        flags = node_flags(service)
        assert one(flags, "--api") == f"0.0.0.0:{API_PORT}"
        assert one(flags, "--advertise-url") == f"http://{name}:{API_PORT}"
        assert one(flags, "--raft") == f"{name}:{RAFT_PORT}"
        assert one(flags, "--raft-bind") == f"0.0.0.0:{RAFT_PORT}"
        assert one(flags, "--data-dir") == "/data"


def test_peers_name_the_two_others_as_they_announce_themselves() -> None:
    announced = {
        name: (one(node_flags(s), "--raft"), one(node_flags(s), "--advertise-url")) for name, s in SERVICES.items()
    }
    for name, service in SEEDS.items():
        peers = [tuple(peer.split(",")) for peer in node_flags(service)["--peer"]]
        expected = {(other, *announced[other]) for other in SEEDS if other != name}
        assert len(peers) == 2 and set(peers) == expected, (name, peers)


def test_the_fourth_node_joins_the_three_and_starts_only_when_asked() -> None:
    for name, service in JOINERS.items():
        flags = node_flags(service)
        assert service["profiles"] == ["join"], name
        assert "--peer" not in flags, name
        assert one(flags, "--join").split(",") == [one(node_flags(seed), "--advertise-url") for seed in SEEDS.values()]


def test_each_node_has_its_own_named_volume_for_data() -> None:
    sources = []
    for name, service in SERVICES.items():
        assert len(service["volumes"]) == 1, name
        source, target = service["volumes"][0].split(":")
        assert target == "/data" and not source.startswith((".", "/")), (name, source)
        sources.append(source)
    assert len(set(sources)) == len(SERVICES)
    assert set(COMPOSE["volumes"]) == set(sources)


def test_only_the_api_is_published_on_distinct_host_ports() -> None:
    host_ports = []
    for name, service in SERVICES.items():
        assert len(service["ports"]) == 1, name
        *_, host_port, container_port = service["ports"][0].split(":")
        assert container_port == API_PORT, name
        host_ports.append(host_port)
    assert host_ports == ["8081", "8082", "8083", "8084"]


@pytest.mark.parametrize("variable", [SECRET_VARIABLE, BOOTSTRAP_KEY_VARIABLE])
def test_the_secrets_come_from_the_environment_only(variable: str) -> None:
    for name, service in SERVICES.items():
        value = service["environment"][variable]
        assert re.fullmatch(rf"\$\{{{variable}:\?[^}}]+\}}", value), (name, value)
        assert "--secret-file" not in node_flags(service), name
        assert "--bootstrap-key-file" not in node_flags(service), name
    for line in COMPOSE_TEXT.splitlines():
        # A literal would be assigned to the variable, or look like a key (hex or base64).
        assignment = re.search(rf"{variable}\s*[:=]\s*(\S+)", line)
        if assignment and not line.lstrip().startswith("#"):
            assert assignment.group(1).startswith("${"), line
        assert not re.search(r"[0-9a-fA-F]{16,}|[A-Za-z0-9+/_-]{32,}={0,2}", line), line


def test_every_node_has_a_healthcheck_on_its_health_endpoint() -> None:
    for name, service in SERVICES.items():
        check = service["healthcheck"]
        assert check["test"][:3] == ["CMD", "python", "-c"], name
        assert f"127.0.0.1:{API_PORT}/v1/health" in check["test"][3], name
        assert {"interval", "timeout", "start_period", "retries"} <= set(check), name


def test_every_flag_in_the_commands_is_one_runstate_node_accepts() -> None:
    finished = subprocess.run(
        [sys.executable, "-m", "runstate_server.node.cli", "node", "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=HELP_TIMEOUT_S,
    )
    assert finished.returncode == 0, finished.stdout + finished.stderr
    documented = set(re.findall(r"--[a-z][a-z0-9-]*", finished.stdout))
    used = {flag for service in SERVICES.values() for flag in node_flags(service)}
    # The README's `runstate node` commands too (continuation lines joined).
    readme = (DOCKER / "README.md").read_text().replace("\\\n", " ")
    used |= {flag for line in readme.splitlines() if "runstate node " in line for flag in re.findall(r"--[a-z][a-z0-9-]*", line)}
    assert used - documented == set(), finished.stdout


# -- Dockerfile ------------------------------------------------------------------------------------


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    found = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


INSTRUCTIONS = instructions(DOCKERFILE_TEXT)


def arguments(name: str) -> list[str]:
    return [rest for word, rest in INSTRUCTIONS if word == name]


def test_dockerfile_base_entrypoint_ports_and_volume() -> None:
    assert arguments("FROM") == ["python:3.11-slim"]
    assert [json.loads(rest) for rest in arguments("ENTRYPOINT")] == [["runstate"]]
    assert set(" ".join(arguments("EXPOSE")).split()) == {API_PORT, RAFT_PORT}
    volumes = [v for rest in arguments("VOLUME") for v in (json.loads(rest) if rest.startswith("[") else rest.split())]
    assert volumes == ["/data"]


def test_dockerfile_runs_as_a_user_that_is_not_root() -> None:
    users = arguments("USER")
    assert users, "no USER"
    user, _, group = users[-1].partition(":")
    assert user not in ("root", "0") and group not in ("root", "0"), users[-1]
    words = [word for word, _ in INSTRUCTIONS]
    last_user = len(words) - 1 - words[::-1].index("USER")
    assert all(word != "RUN" for word in words[last_user:]), "RUN after the last USER runs as that user"


def test_dockerfile_installs_the_package_from_the_repository_source() -> None:
    copied = [rest.split()[:-1] for rest in arguments("COPY")]
    sources = {source.rstrip("/") for group in copied for source in group}
    # The build backend (pyproject.toml's backend-path) and setup.py too: without them pip cannot build.
    assert {"pyproject.toml", "README.md", "setup.py", "_build_backend", "runstate_server"} <= sources, sources
    pip_installs = [rest for rest in arguments("RUN") if re.search(r"pip install .*--no-cache-dir.* \.(\s|$)", rest)]
    assert pip_installs, "no `pip install --no-cache-dir .`"
    # The package source is copied after the dependency layer, so a code change reuses that layer.
    order = [rest for word, rest in INSTRUCTIONS if word in ("COPY", "RUN")]
    assert order.index(next(r for r in order if r.startswith("runstate_server/"))) > order.index(
        next(r for r in order if "-r requirements/server.txt" in r)
    )
    # The dependencies come from the lock, so the package's own install adds none.
    assert all("--no-deps" in rest for rest in pip_installs), pip_installs


def test_dockerfile_dependency_layer_copies_only_the_lock_it_installs() -> None:
    """The dependency layer is built from the lock files alone (copied before anything else of the
    checkout, so a source edit reuses it), and each file it installs is one it copied and exists.
    That it installs requirements/server.txt with --require-hashes: tests/test_lock.py."""
    order = [(word, rest) for word, rest in INSTRUCTIONS if word in ("COPY", "RUN")]
    first_copy = next(rest for word, rest in order if word == "COPY")
    copied = first_copy.split()[:-1]
    assert copied and all(source.startswith("requirements/") for source in copied), first_copy
    installs = [
        word
        for rest in arguments("RUN")
        for words in [shlex.split(rest.replace("&&", ";").replace(";", " ; "))]
        for i, word in enumerate(words)
        if i and words[i - 1] == "-r"
    ]
    assert installs, "no `pip install -r`"
    assert set(installs) == set(copied), (installs, copied)
    assert all((ROOT / name).is_file() for name in installs), installs


# -- the health checks, run against a fake node ---------------------------------------------------


class FakeHealth(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = json.dumps({"status": "ok" if self.status == 200 else "unavailable", "role": "follower"}).encode()
        self.send_response(self.status if self.path == "/v1/health" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def fake_node() -> Iterator[tuple[str, type[FakeHealth]]]:
    handler = type("Handler", (FakeHealth,), {"status": 200})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/health", handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def health_commands() -> dict[str, list[str]]:
    healthcheck = arguments("HEALTHCHECK")
    assert len(healthcheck) == 1
    exec_form = json.loads(healthcheck[0][healthcheck[0].index("CMD") + len("CMD"):])
    commands = {"Dockerfile": exec_form}
    commands.update({name: service["healthcheck"]["test"][1:] for name, service in SERVICES.items()})
    return commands


def run_check(command: list[str], url: str) -> int:
    assert command[:2] == ["python", "-c"], command
    env = {"RUNSTATE_HEALTH_URL": url, "PATH": ""}
    return subprocess.run([sys.executable, "-c", command[2]], env=env, capture_output=True, timeout=30).returncode


def test_health_checks_pass_on_200_and_fail_on_503_or_no_answer(fake_node: tuple[str, type[FakeHealth]]) -> None:
    url, handler = fake_node
    commands = health_commands()
    assert "curl" not in DOCKERFILE_TEXT and "wget" not in DOCKERFILE_TEXT
    for where, command in commands.items():
        assert "http://127.0.0.1:8080/v1/health" in command[2], where
        handler.status = 200
        assert run_check(command, url) == 0, where
        handler.status = 503
        assert run_check(command, url) != 0, where
        assert run_check(command, "http://127.0.0.1:9/v1/health") != 0, where


# -- compose.tls.yml (the TLS override) ------------------------------------------------------------

TLS_TEXT = (DOCKER / "compose.tls.yml").read_text()
TLS = parse_compose(TLS_TEXT)
TLS_SERVICES: dict[str, dict[str, Any]] = TLS["services"]
CERTS_DIR = "/certs"


def runstate_help(*command: str) -> set[str]:
    """The flags `runstate <command> --help` lists."""
    finished = subprocess.run(
        [sys.executable, "-m", "runstate_server.node.cli", *command, "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=HELP_TIMEOUT_S,
    )
    assert finished.returncode == 0, finished.stdout + finished.stderr
    return set(re.findall(r"--[a-z][a-z0-9-]*", finished.stdout))


def test_the_tls_override_covers_every_node_and_runs_its_certs_job_first() -> None:
    assert set(TLS) == {"name", "services", "volumes"} and TLS["name"] == COMPOSE["name"]
    assert set(TLS_SERVICES) == {"certs", *SERVICES} and set(TLS["volumes"]) == {"certs"}
    job = TLS_SERVICES["certs"]
    assert job["image"] == SERVICES["n1"]["image"] and job["build"] == SERVICES["n1"]["build"]
    assert job["volumes"] == [f"certs:{CERTS_DIR}"] and job["restart"] == "no"
    for name in SERVICES:
        service = TLS_SERVICES[name]
        assert service["depends_on"] == {"certs": {"condition": "service_completed_successfully"}}, name
        assert service["volumes"] == [f"certs:{CERTS_DIR}:ro"], name  # beside compose.yml's data volume
        assert service.get("profiles") == SERVICES[name].get("profiles"), name
        # The healthcheck (compose.yml's, and the image's) asks over HTTPS, trusting the CA.
        assert service["environment"] == {
            "RUNSTATE_HEALTH_URL": f"https://127.0.0.1:{API_PORT}/v1/health", "SSL_CERT_FILE": f"{CERTS_DIR}/ca.pem",
        }, name
        assert "RUNSTATE_HEALTH_URL" in " ".join(SERVICES[name]["healthcheck"]["test"])


def test_the_tls_commands_are_compose_ymls_over_https_with_each_nodes_certificate() -> None:
    for name, service in SERVICES.items():
        plain, tls = node_flags(service), node_flags(TLS_SERVICES[name])
        https = {flag: [value.replace("http://", "https://") for value in values] for flag, values in plain.items()}
        assert {flag: values for flag, values in tls.items() if flag in plain} == https, name
        assert {flag: values for flag, values in tls.items() if flag not in plain} == {
            "--tls-cert": [f"{CERTS_DIR}/{name}.pem"], "--tls-key": [f"{CERTS_DIR}/{name}.key"],
            "--tls-ca": [f"{CERTS_DIR}/ca.pem"], "--peer-tls-cert": [f"{CERTS_DIR}/{name}.pem"],
            "--peer-tls-key": [f"{CERTS_DIR}/{name}.key"], "--peer-tls-ca": [f"{CERTS_DIR}/ca.pem"],
        }, name
    used = {flag for name in SERVICES for flag in node_flags(TLS_SERVICES[name])}
    assert used - runstate_help("node") == set()


def test_the_certs_job_writes_every_file_the_nodes_name_once(tmp_path: Path) -> None:
    entrypoint = TLS_SERVICES["certs"]["entrypoint"]
    assert entrypoint[:2] == ["sh", "-c"] and len(entrypoint) == 3
    out = tmp_path / "certs"
    out.mkdir()  # the image's /certs, which the new volume starts as
    runstate = f"{shlex.quote(sys.executable)} -m runstate_server.node.cli"
    script = entrypoint[2].replace(CERTS_DIR, str(out)).replace("exec runstate ", f"exec {runstate} ")
    assert {flag for flag in re.findall(r"--[a-z][a-z0-9-]*", entrypoint[2])} <= runstate_help("certs", "init")
    first = subprocess.run(["sh", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=HELP_TIMEOUT_S)
    assert first.returncode == 0, first.stderr
    named = {value for name in SERVICES for flag, values in node_flags(TLS_SERVICES[name]).items()
             if flag.startswith(("--tls", "--peer-tls")) for value in values}
    assert named and all((out / Path(path).name).is_file() for path in named), sorted(named)
    before = (out / "ca.pem").read_bytes()
    again = subprocess.run(["sh", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=HELP_TIMEOUT_S)
    assert again.returncode == 0 and (out / "ca.pem").read_bytes() == before, again.stderr  # kept, not replaced


def test_the_image_makes_certs_owned_by_the_nodes_user() -> None:
    setup = next(rest for word, rest in INSTRUCTIONS if word == "RUN" and "useradd" in rest)
    assert "mkdir /data /certs" in setup and "chown runstate:runstate /data /certs" in setup
