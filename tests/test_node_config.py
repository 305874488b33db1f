"""Cluster node settings: flags, the TOML file, the secret, and clear refusals."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runstate_server.node import cli
from runstate_server.node.config import ConfigError, HttpLimits, Peer

SECRET = "s" * 32
CLI_TIMEOUT_S = 60


def config_from(argv: list[str]) -> cli.NodeConfig:
    return cli.node_config(cli.build_parser().parse_args(["node", *argv]))


def test_flags_make_a_cluster_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNSTATE_CLUSTER_SECRET", SECRET)
    config = config_from([
        "--node-id", "n1", "--api", "0.0.0.0:8080", "--advertise-url", "http://n1:8080", "--raft", "n1:9000",
        "--raft-bind", "0.0.0.0:9000", "--peer", "n2,n2:9000,http://n2:8080", "--peer", "n3,n3:9000,http://n3:8080/",
        "--data-dir", str(tmp_path), "--fsync", "never", "--retention", "2d", "--compact-after", "100",
    ])
    assert (config.node_id, config.host, config.port, config.api_url) == ("n1", "0.0.0.0", 8080, "http://n1:8080")
    assert (config.raft_address, config.raft_bind, config.secret) == ("n1:9000", "0.0.0.0:9000", SECRET)
    assert config.peers == (Peer("n2", "n2:9000", "http://n2:8080"), Peer("n3", "n3:9000", "http://n3:8080"))
    assert (config.fsync, config.retention_ms, config.compaction_entries) == (False, 2 * 86_400_000, 100)


def test_a_toml_file_gives_the_settings_and_flags_win(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUNSTATE_CLUSTER_SECRET", raising=False)
    (tmp_path / "secret").write_text(SECRET + "\n")
    (tmp_path / "node.toml").write_text(f"""
node_id = "n1"
api = "127.0.0.1:8081"
raft = "127.0.0.1:9081"
data_dir = "{tmp_path / 'data'}"
secret_file = "{tmp_path / 'secret'}"
fsync = "never"
retention = "1h"

[[peers]]
id = "n2"
raft = "127.0.0.1:9082"
api_url = "http://127.0.0.1:8082"
""")
    config = config_from(["--config", str(tmp_path / "node.toml"), "--fsync", "always"])
    assert (config.node_id, config.port, config.secret, config.fsync) == ("n1", 8081, SECRET, True)
    assert config.retention_ms == 3_600_000
    assert config.data_dir == tmp_path / "data"
    assert config.peers == (Peer("n2", "127.0.0.1:9082", "http://127.0.0.1:8082"),)


def test_the_http_limits_come_from_flags_over_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNSTATE_CLUSTER_SECRET", SECRET)
    (tmp_path / "node.toml").write_text('http_connections_max = 500\nhttp_header_timeout = "5s"\nhttp_body_timeout = "20s"\n')
    node = ["--node-id", "n1", "--api", "127.0.0.1:8081", "--raft", "127.0.0.1:9081", "--peer", "n2,127.0.0.1:9082,http://127.0.0.1:8082"]
    config = config_from(["--config", str(tmp_path / "node.toml"), *node, "--http-body-timeout", "45s"])
    assert config.http == HttpLimits(connections_max=500, header_timeout_ms=5_000, body_timeout_ms=45_000)
    assert cli.build_parser().parse_args(["dev"]).http_idle_timeout is None  # the default: HttpLimits'
    (tmp_path / "node.toml").write_text('http_idle_timeout = "soon"\n')
    with pytest.raises(ConfigError, match="http_idle_timeout"):
        config_from(["--config", str(tmp_path / "node.toml"), *node])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--api", "127.0.0.1:8080", "--raft", "127.0.0.1:9000", "--peer", "n2,h:1,http://h:2"], "--node-id"),
        (["--node-id", "n1", "--api", "nonsense", "--raft", "h:9", "--peer", "n2,h:1,http://h:2"], "--api must be HOST:PORT"),
        (["--node-id", "n1", "--api", "h:1", "--raft", "h:9"], "peers"),
        (["--node-id", "n1", "--api", "h:1", "--raft", "h:9", "--peer", "n2,h:1"], "ID,RAFT_HOST:PORT,API_URL"),
        (["--node-id", "n1", "--api", "h:1", "--raft", "h:9", "--peer", "n1,h:1,http://h:2"], "ids must differ"),
    ],
)
def test_bad_settings_are_refused_by_name(argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNSTATE_CLUSTER_SECRET", SECRET)
    with pytest.raises(ConfigError, match=message):
        config_from(argv)


def test_a_cluster_node_refuses_to_start_without_a_secret(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin"}
    finished = subprocess.run(
        [sys.executable, "-m", "runstate_server.node.cli", "node", "--node-id", "n1", "--api", "127.0.0.1:0",
         "--raft", "127.0.0.1:1", "--peer", "n2,127.0.0.1:2,http://127.0.0.1:3", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=CLI_TIMEOUT_S, env=env,
    )
    assert finished.returncode == 2
    assert "cluster secret" in finished.stderr
    short = tmp_path / "short"
    short.write_text("tooshort")
    finished = subprocess.run(
        [sys.executable, "-m", "runstate_server.node.cli", "node", "--node-id", "n1", "--api", "127.0.0.1:0",
         "--raft", "127.0.0.1:1", "--peer", "n2,127.0.0.1:2,http://127.0.0.1:3", "--secret-file", str(short)],
        capture_output=True, text=True, timeout=CLI_TIMEOUT_S, env=env,
    )
    assert finished.returncode == 2
    assert "at least 16 characters" in finished.stderr
