"""Rules of spaces and API keys (runstate_server.actors.access) and the key check of every command
(runstate_server.actors.dispatch), then the same rules against a small model (hypothesis stateful)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from runstate_server.actors import access, dispatch, errors, limits
from runstate_server.actors.state import ApiKey, Space, from_snapshot, to_snapshot
from tests.test_actors_harness import Harness, pack, round_trip, snapshot_bytes, unpack

OPS = "ops"
ALL = list(access.PERMISSIONS)


def hash_of(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class KeyedHarness(Harness):
    """The harness, with commands that carry an API key (`api_key=`, the command's `key`), as a node
    with auth sends them."""

    def __init__(self, space: str = OPS, **kwargs: Any) -> None:
        super().__init__(space=space, **kwargs)
        self.minted = 0

    def apply(
        self, kind: str, *, space: str | None = None, epoch: int | None = None, api_key: str | None = None,
        **args: Any,
    ) -> Any:
        command: dict[str, Any] = {
            "type": kind,
            "v": 1,
            "space": self.space if space is None else space,
            "id": self.next_id(),
            "args": args,
        }
        if api_key is not None:
            command["key"] = api_key
        result, self.effects = self.core.apply(command, self.now_ms, self.epoch if epoch is None else epoch)
        return result

    def new_key_id(self) -> str:
        self.minted += 1
        return f"key_{self.minted:020x}"

    def bootstrap(self, space: str = OPS, key_id: str = "key_ops", secret: str = "secret-ops") -> dict[str, Any]:
        args = {"space_id": space, "key_id": key_id, "key_hash": hash_of(secret), "name": "bootstrap"}
        return self.ok("access.bootstrap", space=dispatch.SYSTEM_SPACE, **args)

    def key_args(self, target: str, permissions: Any = None, secret: str | None = None, **args: Any) -> dict[str, Any]:
        key_id = args.pop("key_id", None) or self.new_key_id()
        return {
            "space_id": target,
            "key_id": key_id,
            "key_hash": hash_of(secret or "secret-" + key_id),
            "name": args.pop("name", None),
            "permissions": ALL if permissions is None else permissions,
            **args,
        }

    def mint(
        self, target: str, permissions: Any = None, *, api_key: str | None = None, space: str | None = None,
        **args: Any,
    ) -> str:
        """Create a key of `target` (the command's space is the caller's, else `target`)."""
        caller_space = self.state.keys[api_key].space if api_key is not None else target
        view = self.ok(
            "key.create", api_key=api_key, space=space or caller_space, **self.key_args(target, permissions, **args)
        )
        return str(view["id"])


@pytest.fixture
def h() -> KeyedHarness:
    harness = KeyedHarness()
    harness.bootstrap()
    return harness


def stored(h: Harness, key_id: str) -> ApiKey:
    return h.state.keys[key_id]


# -- bootstrap -----------------------------------------------------------------------------------


def test_permissions_are_four_in_a_fixed_order() -> None:
    assert access.PERMISSIONS == ("admin", "resource_config", "coordination_write", "coordination_read")


def test_bootstrap_makes_the_operator_space_and_its_admin_key() -> None:
    h = KeyedHarness()
    assert h.bootstrap() == {"bootstrapped": True, "space": OPS, "keyId": "key_ops"}
    assert h.state.operator_space == OPS
    space = h.state.spaces[OPS]
    assert (space.created_ms, space.key_count, space.name) == (h.now_ms, 1, None)
    admin = access.authenticate(h.state, hash_of("secret-ops"))
    assert admin is not None and admin.id == "key_ops"
    assert access.key_view(admin) == {
        "id": "key_ops", "space": OPS, "name": "bootstrap", "permissions": ALL, "createdAt": h.now_ms,
        "revokedAt": None, "createdBy": None,
    }
    assert access.is_operator_admin(h.state, admin)


def test_bootstrap_happens_once() -> None:
    h = KeyedHarness()
    h.bootstrap()
    before = snapshot_bytes(h.state, without_clock=True)
    assert h.bootstrap("other", "key_other", "secret-other") == {"bootstrapped": False, "space": OPS}
    assert snapshot_bytes(h.state, without_clock=True) == before


def test_bootstrap_keeps_the_data_of_a_space_used_without_keys() -> None:
    h = KeyedHarness(space="default")
    h.ensure()
    run_id = h.create_run()
    h.submit(run_id, "k")
    created_ms = h.state.spaces["default"].created_ms
    h.advance(5_000)
    assert h.bootstrap("default")["bootstrapped"] is True
    space = h.state.spaces["default"]
    assert (space.run_count, space.task_count, list(space.mailboxes), space.created_ms) == (1, 1, ["work"], created_ms)
    assert space.key_count == 1 and h.state.operator_space == "default"
    assert h.ok("task.submit", api_key="key_ops", **h.submit_args(run_id, "k2"))["created"] is True


def test_bootstrap_after_keys_of_keyless_days_counts_them() -> None:
    h = KeyedHarness(space="default")
    minted = h.mint("default", ["coordination_read"])
    h.bootstrap("default")
    assert h.state.spaces["default"].key_count == 2
    assert not access.is_operator_admin(h.state, stored(h, minted))  # not an admin key
    assert access.is_operator_admin(h.state, stored(h, "key_ops"))


def test_bootstrap_is_a_command_of_the_leader_only() -> None:
    h = KeyedHarness()
    args = {"space_id": OPS, "key_id": "key_ops", "key_hash": hash_of("s"), "name": None}
    assert h.err("access.bootstrap", space=OPS, **args) == errors.VALIDATION_FAILED
    assert h.state.operator_space is None


@pytest.mark.parametrize(
    "bad",
    [{"space_id": "has space"}, {"space_id": ""}, {"space_id": "x" * 129}, {"key_hash": "ABC"},
     {"key_hash": hash_of("s").upper()}, {"key_id": ""}, {"key_id": None}, {"name": "n" * 129}],
)
def test_bootstrap_validates_its_arguments(bad: dict[str, Any]) -> None:
    h = KeyedHarness()
    args = {"space_id": OPS, "key_id": "key_ops", "key_hash": hash_of("s"), "name": None, **bad}
    assert h.err("access.bootstrap", space="", **args) == errors.VALIDATION_FAILED


def test_bootstrap_refuses_a_secret_minted_before(monkeypatch: pytest.MonkeyPatch) -> None:
    h = KeyedHarness(space="default")
    h.mint("default", secret="same")
    args = {"space_id": OPS, "key_id": "key_ops", "key_hash": hash_of("same"), "name": None}
    assert h.err("access.bootstrap", space="", **args) == errors.CONFLICT
    monkeypatch.setattr(limits, "keys_per_space_max", 1)
    args = {"space_id": "default", "key_id": "key_ops", "key_hash": hash_of("new"), "name": None}
    assert h.err("access.bootstrap", space="", **args) == errors.LIMIT_EXCEEDED


# -- spaces --------------------------------------------------------------------------------------


def test_an_operator_admin_creates_spaces(h: KeyedHarness) -> None:
    h.advance(1_000)
    view = h.ok("space.create", api_key="key_ops", space_id="acme", name="Acme")
    assert view == {"id": "acme", "name": "Acme", "createdAt": h.now_ms}
    assert access.list_spaces(h.state) == [
        {"id": OPS, "name": None, "createdAt": h.now_ms - 1_000}, view,
    ]
    assert access.list_spaces(h.state, ["acme", "nowhere"]) == [view]
    assert h.err("space.create", api_key="key_ops", space_id="acme", name=None) == errors.CONFLICT
    assert h.err("space.create", api_key="key_ops", space_id=OPS, name=None) == errors.CONFLICT


def test_only_an_admin_key_of_the_operator_space_creates_spaces(h: KeyedHarness) -> None:
    h.ok("space.create", api_key="key_ops", space_id="acme", name=None)
    acme_admin = h.mint("acme", ALL, api_key="key_ops")
    ops_writer = h.mint(OPS, ["coordination_write", "resource_config"], api_key="key_ops")
    assert h.err("space.create", api_key=acme_admin, space="acme", space_id="b", name=None) == errors.FORBIDDEN
    assert h.err("space.create", api_key=ops_writer, space_id="b", name=None) == errors.FORBIDDEN
    h.ok("key.revoke", api_key="key_ops", key_id="key_ops")
    second = h.mint(OPS, ["admin"], api_key=None)  # a keyless node (the trust boundary) may
    h.ok("space.create", api_key=second, space_id="b", name=None)


def test_a_keyless_node_creates_spaces_and_its_own_space_too() -> None:
    h = KeyedHarness(space="default")
    assert h.ok("space.create", space_id="default", name="Default")["id"] == "default"
    assert h.state.spaces["default"].name == "Default"
    h.ok("space.create", space_id="other", name=None)
    assert "other" in h.state.spaces
    assert h.err("space.create", space_id="default", name=None) == errors.CONFLICT


@pytest.mark.parametrize("bad", [{"space_id": None}, {"space_id": "a/b"}, {"space_id": "é"}, {"name": 5}])
def test_space_create_validates(h: KeyedHarness, bad: dict[str, Any]) -> None:
    assert h.err("space.create", api_key="key_ops", **{"space_id": "ok", "name": None, **bad}) == errors.VALIDATION_FAILED


def test_spaces_are_bounded(h: KeyedHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "spaces_max", 2)
    h.ok("space.create", api_key="key_ops", space_id="s1", name=None)
    assert h.err("space.create", api_key="key_ops", space_id="s2", name=None) == errors.LIMIT_EXCEEDED


# -- keys ----------------------------------------------------------------------------------------


def test_key_create_answers_the_view_and_stores_only_the_hash(h: KeyedHarness) -> None:
    args = h.key_args(OPS, ["coordination_read", "admin"], secret="s1", name="ci")
    view = h.ok("key.create", api_key="key_ops", **args)
    assert view == {
        "id": args["key_id"], "space": OPS, "name": "ci", "permissions": ["admin", "coordination_read"],
        "createdAt": h.now_ms, "revokedAt": None, "createdBy": "key_ops",
    }
    assert "s1" not in str(to_snapshot(h.state))
    assert stored(h, args["key_id"]).hash == hash_of("s1")
    assert access.list_keys(h.state, OPS)[1] == view
    assert h.state.spaces[OPS].key_count == 2


@pytest.mark.parametrize(
    "permissions", [[], None, "admin", ["admin", "root"], ["ADMIN"], [None], {"admin": True}],
)
def test_key_create_needs_known_permissions(h: KeyedHarness, permissions: Any) -> None:
    args = {**h.key_args(OPS), "permissions": permissions}
    assert h.err("key.create", api_key="key_ops", **args) == errors.VALIDATION_FAILED


def test_key_create_keeps_each_permission_once_in_order(h: KeyedHarness) -> None:
    minted = h.mint(OPS, ["coordination_read", "coordination_write", "coordination_read"], api_key="key_ops")
    assert stored(h, minted).permissions == ["coordination_write", "coordination_read"]


def test_key_create_validates_name_id_and_hash(h: KeyedHarness) -> None:
    for bad in ({"name": "n" * (limits.name_chars_max + 1)}, {"key_id": "a b"}, {"key_hash": "00"}):
        args = {**h.key_args(OPS), **bad}
        assert h.err("key.create", api_key="key_ops", **args) == errors.VALIDATION_FAILED


def test_key_create_refuses_a_taken_id_or_secret(h: KeyedHarness) -> None:
    first = h.mint(OPS, api_key="key_ops", secret="one")
    assert h.err("key.create", api_key="key_ops", **h.key_args(OPS, key_id=first, secret="two")) == errors.CONFLICT
    assert h.err("key.create", api_key="key_ops", **h.key_args(OPS, secret="one")) == errors.CONFLICT
    h.ok("key.revoke", api_key="key_ops", key_id=first)
    # A revoked key's secret and id stay taken.
    assert h.err("key.create", api_key="key_ops", **h.key_args(OPS, secret="one")) == errors.CONFLICT
    assert h.err("key.create", api_key="key_ops", **h.key_args(OPS, key_id=first, secret="3")) == errors.CONFLICT


def test_keys_per_space_are_bounded_revoked_ones_included(h: KeyedHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "keys_per_space_max", 3)
    minted = [h.mint(OPS, api_key="key_ops"), h.mint(OPS, api_key="key_ops")]
    h.ok("key.revoke", api_key="key_ops", key_id=minted[0])
    assert h.err("key.create", api_key="key_ops", **h.key_args(OPS)) == errors.LIMIT_EXCEEDED
    h.ok("space.create", api_key="key_ops", space_id="acme", name=None)
    h.mint("acme", api_key="key_ops")  # per space


def test_a_space_admin_manages_the_keys_of_its_own_space_only(h: KeyedHarness) -> None:
    h.ok("space.create", api_key="key_ops", space_id="acme", name=None)
    h.ok("space.create", api_key="key_ops", space_id="beta", name=None)
    acme_admin = h.mint("acme", ["admin"], api_key="key_ops")
    minted = h.mint("acme", ["coordination_write"], api_key=acme_admin)
    assert stored(h, minted).created_by == acme_admin
    for target in ("beta", OPS, "nowhere"):
        args = h.key_args(target)
        assert h.err("key.create", api_key=acme_admin, space="acme", **args) == errors.FORBIDDEN
    beta_key = h.mint("beta", api_key="key_ops")
    assert h.err("key.revoke", api_key=acme_admin, space="acme", key_id=beta_key) == errors.NOT_FOUND
    assert h.err("key.revoke", api_key=acme_admin, space="acme", key_id="key_ops") == errors.NOT_FOUND
    assert h.err("key.revoke", api_key=acme_admin, space="acme", key_id="key_nope") == errors.NOT_FOUND
    assert access.list_keys(h.state, "acme") == [
        access.key_view(stored(h, acme_admin)), access.key_view(stored(h, minted))
    ]
    assert h.ok("key.revoke", api_key=acme_admin, space="acme", key_id=minted)["revokedAt"] == h.now_ms


def test_key_management_needs_the_admin_permission(h: KeyedHarness) -> None:
    writer = h.mint(OPS, ["coordination_write", "coordination_read", "resource_config"], api_key="key_ops")
    assert h.err("key.create", api_key=writer, **h.key_args(OPS, ["coordination_read"])) == errors.FORBIDDEN
    assert h.err("key.revoke", api_key=writer, key_id=writer) == errors.FORBIDDEN
    assert h.err("key.revoke", api_key=writer, key_id="key_nope") == errors.FORBIDDEN  # learns nothing either


def test_an_operator_admin_manages_the_keys_of_every_space(h: KeyedHarness) -> None:
    h.ok("space.create", api_key="key_ops", space_id="acme", name=None)
    minted = h.mint("acme", ["coordination_read"], api_key="key_ops")
    assert stored(h, minted).space == "acme"
    assert h.ok("key.revoke", api_key="key_ops", key_id=minted)["revokedAt"] == h.now_ms
    # A space must exist before an operator gives it keys (only the command's own space is implicit).
    assert h.err("key.create", api_key="key_ops", **h.key_args("nowhere")) == errors.NOT_FOUND
    # An admin key of the operator space that was revoked manages nothing (it is refused first).
    second = h.mint(OPS, ["admin"], api_key="key_ops")
    h.ok("key.revoke", api_key=second, key_id="key_ops")
    assert h.err("space.create", api_key="key_ops", space_id="x", name=None) == errors.UNAUTHENTICATED
    assert not access.is_operator_admin(h.state, stored(h, "key_ops"))


def test_a_keyless_node_mints_keys_in_a_new_space_which_then_exists() -> None:
    h = KeyedHarness(space="default")
    assert "default" not in h.state.spaces
    minted = h.mint("default", ["admin"])
    space = h.state.spaces["default"]
    assert (space.key_count, space.created_ms) == (1, h.now_ms)
    assert stored(h, minted).created_by is None
    assert h.err("key.create", **h.key_args("elsewhere")) == errors.NOT_FOUND
    # A refused key.create in a new space leaves no space behind.
    assert h.err("key.create", space="fresh", **h.key_args("fresh", [])) == errors.VALIDATION_FAILED
    assert "fresh" not in h.state.spaces
    # Without an operator space no key is an operator admin.
    assert not access.is_operator_admin(h.state, stored(h, minted))


def test_revoke_is_idempotent_and_keeps_the_first_time(h: KeyedHarness) -> None:
    minted = h.mint(OPS, ["coordination_read"], api_key="key_ops", secret="r")
    first = h.ok("key.revoke", api_key="key_ops", key_id=minted)
    assert first["revokedAt"] == h.now_ms and access.authenticate(h.state, hash_of("r")) is None
    h.advance(5_000)
    assert h.ok("key.revoke", api_key="key_ops", key_id=minted) == first
    assert stored(h, minted).revoked_ms == h.now_ms - 5_000
    assert access.list_keys(h.state, OPS)[1] == first


def test_a_key_may_revoke_itself_and_is_refused_afterwards(h: KeyedHarness) -> None:
    admin = h.mint(OPS, ["admin"], api_key="key_ops")
    h.ok("key.revoke", api_key=admin, key_id=admin)
    assert h.err("key.revoke", api_key=admin, key_id=admin) == errors.UNAUTHENTICATED


def test_the_caller_comes_from_the_command_not_from_its_args(h: KeyedHarness) -> None:
    h.ok("space.create", api_key="key_ops", space_id="acme", name=None)
    acme_admin = h.mint("acme", ["admin"], api_key="key_ops")
    forged = {"key_id_of_caller": "key_ops", "caller": "key_ops", "key": "key_ops"}
    assert h.err("space.create", api_key=acme_admin, space="acme", space_id="x", name=None, **forged) == errors.FORBIDDEN
    args = {**h.key_args(OPS), **forged}
    assert h.err("key.create", api_key=acme_admin, space="acme", **args) == errors.FORBIDDEN
    view = h.ok("key.create", **{**h.key_args(OPS), "caller": acme_admin})  # keyless: trusted
    assert view["createdBy"] is None


# -- the key every command carries ---------------------------------------------------------------

EVERY_COMMAND = sorted({*dispatch.HANDLERS, "barrier", "tick", "leader.start", "access.bootstrap", "nonsense"})


@pytest.mark.parametrize("kind", EVERY_COMMAND)
def test_an_unknown_or_revoked_key_is_refused_by_every_command(h: KeyedHarness, kind: str) -> None:
    revoked = h.mint(OPS, ALL, api_key="key_ops")
    h.ok("key.revoke", api_key="key_ops", key_id=revoked)
    h.ensure()
    run_id = h.create_run()
    for key_id in (revoked, "key_unknown", 7):
        code = h.err(kind, api_key=key_id, run_id=run_id, name="work", retention_ms=1, mailbox="work")  # type: ignore[arg-type]
        assert code == errors.UNAUTHENTICATED


@pytest.mark.parametrize("kind", EVERY_COMMAND)
def test_a_key_of_another_space_is_refused_by_every_command(h: KeyedHarness, kind: str) -> None:
    h.ok("space.create", api_key="key_ops", space_id="acme", name=None)
    acme = h.mint("acme", ALL, api_key="key_ops")
    for space in ("ops", "elsewhere", dispatch.SYSTEM_SPACE):
        assert h.err(kind, api_key=acme, space=space, name="work", retention_ms=1) == errors.FORBIDDEN
    assert h.err(kind, api_key="key_ops", space="acme", name="work", retention_ms=1) == errors.FORBIDDEN


def test_a_live_key_works_in_its_own_space(h: KeyedHarness) -> None:
    reader = h.mint(OPS, ["coordination_read"], api_key="key_ops")
    assert h.ok("barrier", api_key=reader) == {}
    h.ok("mailbox.ensure", api_key="key_ops", name="work")
    assert h.ok("run.create", api_key="key_ops")["run_id"].startswith("run_")
    h.ok("key.revoke", api_key="key_ops", key_id=reader)
    assert h.err("barrier", api_key=reader) == errors.UNAUTHENTICATED  # a read after the revoke is refused


def test_authenticate_compares_in_constant_time(h: KeyedHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[str, str]] = []

    def compare(a: str, b: str) -> bool:
        compared.append((a, b))
        return a == b

    monkeypatch.setattr(access.hmac, "compare_digest", compare)
    assert access.authenticate(h.state, hash_of("secret-ops")) is stored(h, "key_ops")
    assert compared == [(hash_of("secret-ops"), hash_of("secret-ops"))]
    assert access.authenticate(h.state, hash_of("other")) is None
    assert access.authenticate(h.state, "") is None
    assert access.authenticate(h.state, "é" * 64) is None
    assert len(compared) == 1  # only a hash that is found is compared


# -- snapshots -----------------------------------------------------------------------------------


def keyed_harness() -> KeyedHarness:
    h = KeyedHarness()
    h.bootstrap()
    h.ok("space.create", api_key="key_ops", space_id="acme", name="Acme")
    acme = h.mint("acme", ["admin", "coordination_write"], api_key="key_ops", name="acme admin")
    h.mint("acme", ["coordination_read"], api_key=acme, space="acme")
    h.ok("key.revoke", api_key=acme, space="acme", key_id=acme)
    h.ensure()
    h.create_run()
    return h


def test_snapshot_round_trip_with_keys() -> None:
    h = keyed_harness()
    snapshot = to_snapshot(h.state)
    assert "key_ids_by_hash" not in snapshot and snapshot["operator_space"] == OPS
    restored = round_trip(h.state)
    assert restored == h.state
    assert snapshot_bytes(restored) == snapshot_bytes(h.state)
    assert restored.key_ids_by_hash == h.state.key_ids_by_hash and len(restored.key_ids_by_hash) == 3
    assert access.authenticate(restored, hash_of("secret-ops")) == stored(h, "key_ops")
    # A value: later changes alter neither the snapshot nor a restored state.
    frozen = pack(snapshot)
    h.ok("key.revoke", api_key="key_ops", key_id="key_ops")
    assert pack(snapshot) == frozen and restored.keys["key_ops"].revoked_ms is None


def test_a_snapshot_from_before_keys_still_loads() -> None:
    h = KeyedHarness(space="default")
    h.ensure()
    h.create_run()
    old = unpack(snapshot_bytes(h.state))
    del old["keys"], old["operator_space"], old["events"]
    old["spaces"] = [row[:5] for row in old["spaces"]]
    state = from_snapshot(old)
    assert state.spaces["default"] == Space(
        id="default", mailboxes=h.state.spaces["default"].mailboxes, run_count=1,
        mailbox_names=h.state.spaces["default"].mailbox_names,
    )
    assert (state.keys, state.key_ids_by_hash, state.operator_space) == ({}, {}, None)
    twin = KeyedHarness(space="default")
    twin.core.restore(old)
    twin.commands = h.commands
    twin.bootstrap("default")
    assert twin.state.spaces["default"].key_count == 1


# -- against a model -----------------------------------------------------------------------------

SPACES = (OPS, "s1", "s2")
GHOST_KEY = "key_ghost"


@dataclass
class ModelKey:
    id: str
    space: str
    permissions: list[str]
    hash: str
    created_ms: int
    revoked_ms: int | None = None


class Rejection(Exception):
    def __init__(self, code: str) -> None:
        self.code = code


class AccessMachine(RuleBasedStateMachine):
    """Spaces and keys created, revoked and used by random callers. The model keeps which spaces
    exist, the operator space and every key; after each step the core agrees with it on the
    answer, on who authenticates, and on the keys' fields; a refused step changes nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.h = KeyedHarness()
        self.spaces: set[str] = set()
        self.operator: str | None = None
        self.keys: dict[str, ModelKey] = {}
        self.hashes = [hash_of("never minted")]

    # -- helpers ---------------------------------------------------------------------------------

    def operator_admin(self, key: ModelKey) -> bool:
        return key.space == self.operator and key.revoked_ms is None and "admin" in key.permissions

    def check_key(self, caller: str | None, space: str) -> ModelKey | None:
        if caller is None:
            return None
        key = self.keys.get(caller)
        if key is None or key.revoked_ms is not None:
            raise Rejection(errors.UNAUTHENTICATED)
        if key.space != space:
            raise Rejection(errors.FORBIDDEN)
        return key

    def execute(self, kind: str, caller: str | None, space: str, args: dict[str, Any], model_step: Any) -> Any:
        """Apply `kind` to the core and `model_step` to the model; they must agree on success or the
        error code, and on the answer when model_step returns one. Returns the core's answer (None
        when refused)."""
        before = snapshot_bytes(self.h.state, without_clock=True)
        result = self.h.apply(kind, api_key=caller, space=space, **args)
        try:
            expected = model_step()
        except Rejection as rejection:
            event(f"{kind} -> {rejection.code}")
            assert result.get("error", {}).get("code") == rejection.code, (kind, caller, space, args, result)
            assert snapshot_bytes(self.h.state, without_clock=True) == before, f"refused {kind} changed the state"
            return None
        assert "error" not in result, (kind, caller, space, args, result)
        event(f"{kind} -> ok")
        if expected is not None:
            assert result == expected
        return result

    def draw_caller(self, data: st.DataObject) -> tuple[str | None, str]:
        """(key id or None, the command's space): mostly a key in its own space."""
        keys = sorted(self.keys)
        caller = data.draw(st.sampled_from([None, GHOST_KEY, *keys, *keys, *keys]), label="caller")
        own = self.keys[caller].space if caller in self.keys else OPS
        space = data.draw(st.sampled_from([own, own, own, *SPACES]), label="space")
        return caller, space

    # -- rules -----------------------------------------------------------------------------------

    @initialize(bootstrap=st.booleans())
    def start(self, bootstrap: bool) -> None:
        if bootstrap:
            self.do_bootstrap(OPS)

    @rule(space=st.sampled_from(SPACES))
    def do_bootstrap(self, space: str) -> None:
        secret = f"boot-{len(self.hashes)}"
        key_id = self.h.new_key_id()
        args = {"space_id": space, "key_id": key_id, "key_hash": hash_of(secret), "name": None}

        def model() -> dict[str, Any]:
            if self.operator is not None:
                return {"bootstrapped": False, "space": self.operator}
            self.operator = space
            self.spaces.add(space)
            self.keys[key_id] = ModelKey(key_id, space, ALL, hash_of(secret), self.h.now_ms)
            self.hashes.append(hash_of(secret))
            return {"bootstrapped": True, "space": space, "keyId": key_id}

        self.execute("access.bootstrap", None, dispatch.SYSTEM_SPACE, args, model)

    @rule(data=st.data(), target_space=st.sampled_from(SPACES))
    def create_space(self, data: st.DataObject, target_space: str) -> None:
        caller, space = self.draw_caller(data)
        target = target_space

        def model() -> None:
            key = self.check_key(caller, space)
            if key is not None and not self.operator_admin(key):
                raise Rejection(errors.FORBIDDEN)
            if target in self.spaces:
                raise Rejection(errors.CONFLICT)
            self.spaces.add(target)

        self.execute("space.create", caller, space, {"space_id": target, "name": None}, model)

    @rule(
        data=st.data(),
        target_space=st.sampled_from(SPACES),
        permissions=st.lists(st.sampled_from([*access.PERMISSIONS, "root"]), max_size=3),
        reuse_secret=st.integers(0, 5),
    )
    def create_key(self, data: st.DataObject, target_space: str, permissions: list[str], reuse_secret: int) -> None:
        caller, space = self.draw_caller(data)
        target = target_space
        key_id = self.h.new_key_id()
        key_hash = self.hashes[-1] if reuse_secret == 0 else hash_of(f"minted-{key_id}")
        args = {"space_id": target, "key_id": key_id, "key_hash": key_hash, "name": None, "permissions": permissions}

        def model() -> None:
            key = self.check_key(caller, space)
            if key is not None:
                if "admin" not in key.permissions:
                    raise Rejection(errors.FORBIDDEN)
                if target != key.space and not self.operator_admin(key):
                    raise Rejection(errors.FORBIDDEN)
            if target != space and target not in self.spaces:
                raise Rejection(errors.NOT_FOUND)
            if not permissions or "root" in permissions:
                raise Rejection(errors.VALIDATION_FAILED)
            if any(k.hash == key_hash for k in self.keys.values()):
                raise Rejection(errors.CONFLICT)
            ordered = [p for p in access.PERMISSIONS if p in permissions]
            self.keys[key_id] = ModelKey(key_id, target, ordered, key_hash, self.h.now_ms)
            self.spaces.add(target)
            if key_hash not in self.hashes:
                self.hashes.append(key_hash)

        result = self.execute("key.create", caller, space, args, model)
        if result is not None:
            assert result["createdBy"] == caller and result["id"] == key_id

    @rule(data=st.data())
    def revoke_key(self, data: st.DataObject) -> None:
        caller, space = self.draw_caller(data)
        key_id = data.draw(st.sampled_from([GHOST_KEY, *sorted(self.keys)]), label="key_id")

        def model() -> None:
            key = self.check_key(caller, space)
            if key is not None and "admin" not in key.permissions:
                raise Rejection(errors.FORBIDDEN)
            target = self.keys.get(key_id)
            if target is None or (key is not None and target.space != key.space and not self.operator_admin(key)):
                raise Rejection(errors.NOT_FOUND)
            if target.revoked_ms is None:
                target.revoked_ms = self.h.now_ms

        result = self.execute("key.revoke", caller, space, {"key_id": key_id}, model)
        if result is not None:
            assert result["revokedAt"] == self.keys[key_id].revoked_ms

    @rule(data=st.data(), kind=st.sampled_from(["run.create", "mailbox.ensure", "barrier"]))
    def coordinate(self, data: st.DataObject, kind: str) -> None:
        """A command of the coordination API: allowed with a live key of its space, or no key."""
        caller, space = self.draw_caller(data)

        def model() -> None:
            self.check_key(caller, space)
            if kind != "barrier":
                self.spaces.add(space)

        self.execute(kind, caller, space, {"name": "work"}, model)

    @rule(seconds=st.integers(1, 5))
    def advance(self, seconds: int) -> None:
        self.h.advance(seconds * 1000)

    @rule()
    def restart_from_snapshot(self) -> None:
        self.h.core.restore(unpack(pack(self.h.core.snapshot())))

    # -- checks ----------------------------------------------------------------------------------

    @invariant()
    def authenticate_agrees_with_the_model(self) -> None:
        by_hash = {key.hash: key for key in self.keys.values()}
        for key_hash in self.hashes:
            found = access.authenticate(self.h.state, key_hash)
            expected = by_hash.get(key_hash)
            if expected is None or expected.revoked_ms is not None:
                assert found is None
            else:
                assert found is not None and found.id == expected.id
        for key_id, expected in self.keys.items():
            core_key = self.h.state.keys[key_id]
            assert (core_key.space, core_key.permissions, core_key.hash, core_key.created_ms, core_key.revoked_ms) == (
                expected.space, expected.permissions, expected.hash, expected.created_ms, expected.revoked_ms,
            )
            assert access.is_operator_admin(self.h.state, core_key) == self.operator_admin(expected)
        assert set(self.h.state.keys) == set(self.keys)
        assert set(self.h.state.spaces) == self.spaces
        assert self.h.state.operator_space == self.operator
        for space_id in SPACES:
            count = sum(1 for key in self.keys.values() if key.space == space_id)
            assert len(access.list_keys(self.h.state, space_id)) == count
            if space_id in self.spaces:
                assert self.h.state.spaces[space_id].key_count == count

    @invariant()
    def snapshot_is_a_value(self) -> None:
        data = snapshot_bytes(self.h.state)
        restored = round_trip(self.h.state)
        assert snapshot_bytes(restored) == data
        assert restored == self.h.state


AccessMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_access_against_the_model = AccessMachine.TestCase
