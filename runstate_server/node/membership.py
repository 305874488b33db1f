"""A node that joins a running cluster (`runstate node --join URL`), and what its data dir keeps of
that (cluster/DESIGN.md "Membership").

The joining node asks a member (`POST /v1/cluster/join`, forwarded to the leader) to record it as
a learner. It has no API key: the request carries a proof that it holds the cluster secret, an
HMAC-SHA256 of the body under a key derived from the secret (`join_proof`). The answer names the
voters; the node keeps them, and its role, in `membership.json` in its data dir, then follows the
log as a learner until the leader promotes it. A restart reads the file: no `--join` again.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runstate_server.cluster.private_files import open_private
from runstate_server.node.config import ConfigError, Peer

MEMBERSHIP_FILE_NAME = "membership.json"
JOIN_PROOF_HEADER = "X-Runstate-Join-Proof"
JOIN_PATH = "/v1/cluster/join"
_JOIN_KEY_CONTEXT = b"runstate cluster join v1"
JOIN_TIMEOUT_S = 60.0  # asking the members in turn until one records the node
JOIN_REQUEST_TIMEOUT_S = 15.0  # one member's answer (the leader commits the learner first)
JOIN_RETRY_PAUSE_S = 0.5
LEARNER, VOTER = "learner", "voter"
REMOVED = "removed"  # the node learned it was removed: it does not start again on this data dir


class JoinError(Exception):
    """The cluster did not take this node; the message says why."""


@dataclass(frozen=True, slots=True)
class Membership:
    """What the data dir keeps: this node's role, and the voters as it last knew them."""

    role: str
    voters: tuple[Peer, ...]
    epoch: int = 1  # the cluster's epoch (DESIGN.md "Membership")


def join_proof(secret: str, body: bytes) -> str:
    """The proof that a join request's sender holds the cluster secret."""
    key = hmac.new(secret.encode(), _JOIN_KEY_CONTEXT, hashlib.sha256).digest()
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def proof_holds(secret: str, body: bytes, proof: str | None) -> bool:
    return proof is not None and hmac.compare_digest(join_proof(secret, body), proof)


def read_membership(data_dir: Path) -> Membership | None:
    """The data dir's membership, None when it has none (a node seeded by --peer flags)."""
    path = data_dir / MEMBERSHIP_FILE_NAME
    try:
        document = json.loads(path.read_text())
        role = document["role"]
        voters = tuple(Peer(voter["id"], voter["raftAddress"], voter["apiUrl"]) for voter in document["voters"])
        epoch = document.get("epoch", 1)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"cannot read {path}: {error!r}") from None
    if role not in (LEARNER, VOTER, REMOVED) or type(epoch) is not int or epoch < 1:
        raise ConfigError(f"{path}: unknown role {role!r} or epoch {epoch!r}")
    return Membership(role, voters, epoch)


def write_membership(data_dir: Path, membership: Membership) -> None:
    """Replace the data dir's membership file whole (a temporary file, fsynced, renamed)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / MEMBERSHIP_FILE_NAME
    temporary = path.with_suffix(".json.writing")
    document = {
        "role": membership.role,
        "epoch": membership.epoch,
        "voters": [{"id": peer.id, "raftAddress": peer.raft_address, "apiUrl": peer.api_url} for peer in membership.voters],
    }
    with open_private(temporary) as file:
        file.write(json.dumps(document, indent=2).encode())
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


def ask_to_join(
    urls: list[str], secret: str, node_id: str, raft_address: str, api_url: str, *, context: ssl.SSLContext | None = None,
) -> Membership:
    """Ask the members at `urls`, in turn, to record this node as a learner, until one does or
    JOIN_TIMEOUT_S passes. JoinError when a member refuses it (the answer's code and message) or
    none answers. `context`: how an https:// member is verified (node/tls.py client_context)."""
    body = json.dumps({"nodeId": node_id, "raftAddress": raft_address, "apiUrl": api_url}).encode()
    headers = {"Content-Type": "application/json", JOIN_PROOF_HEADER: join_proof(secret, body)}
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    failures: list[str] = []
    while True:
        for url in urls:
            request = urllib.request.Request(url.rstrip("/") + JOIN_PATH, data=body, method="POST", headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=JOIN_REQUEST_TIMEOUT_S, context=context) as answer:
                    document: Any = json.loads(answer.read())
                voters = tuple(Peer(voter["id"], voter["raftAddress"], voter["apiUrl"]) for voter in document["voters"])
                return Membership(LEARNER, voters, int(document.get("epoch", 1)))
            except urllib.error.HTTPError as error:
                code, message = _error_of(error)
                error.close()
                if error.code != 503:  # refused: asking again changes nothing
                    raise JoinError(f"{url} refused: {code}: {message}") from None
                failures.append(f"{url}: {code}: {message}")
            except (OSError, ValueError, KeyError, TypeError) as error:
                failures.append(f"{url}: {error}")
        if time.monotonic() >= deadline:
            raise JoinError(f"no member took this node within {JOIN_TIMEOUT_S:.0f} s: {'; '.join(failures[-len(urls):])}")
        time.sleep(JOIN_RETRY_PAUSE_S)


def _error_of(error: urllib.error.HTTPError) -> tuple[str, str]:
    try:
        envelope = json.loads(error.read())["error"]
        return str(envelope["code"]), str(envelope["message"])
    except (ValueError, KeyError, TypeError, OSError):
        return str(error.code), error.reason
