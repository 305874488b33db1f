"""Spaces, API keys and whoami through the SDK against a real `runstate dev --auth` node: the
operator's bootstrap key, a space admin's narrower view, keys that work at once and stop at once
when revoked, and the errors of each refusal. Also a node without auth, which mints no keys."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from runstate import (
    AsyncRunstate,
    ConfigError,
    ConflictError,
    ForbiddenError,
    NotFoundError,
    Runstate,
    UnauthenticatedError,
    ValidationError,
)
from runstate.sdk import PERMISSIONS, Identity, KeyInfo, NewKey, SpaceInfo

from tests._nodes import DevNode

OPERATOR_SPACE = "default"
CLOCK_SLACK = timedelta(minutes=5)  # times the node stamps are near the test's clock


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def recent(value: datetime) -> bool:
    now = datetime.now(timezone.utc)
    return value.tzinfo is not None and now - CLOCK_SLACK < value < now + CLOCK_SLACK


@pytest.fixture
def operator(auth_node: tuple[DevNode, str]) -> Iterator[Runstate]:
    node, secret = auth_node
    with Runstate(base_url=node.url, api_key=secret) as rs:
        yield rs


@pytest.fixture
def space_admin(auth_node: tuple[DevNode, str], operator: Runstate) -> Iterator[Runstate]:
    """A client with an admin key of a fresh space of its own (not the operator space)."""
    space = operator.spaces.create(id=unique("team"))
    key = operator.keys.create(["admin"], space=space.id, name="team admin")
    with Runstate(base_url=auth_node[0].url, api_key=key.secret) as rs:
        yield rs


def test_whoami_of_the_bootstrap_key(operator: Runstate) -> None:
    identity = operator.whoami()
    assert isinstance(identity, Identity)
    assert identity.auth is True
    assert identity.key_id is not None and identity.key_id.startswith("key_")
    assert identity.space == OPERATOR_SPACE
    assert identity.permissions == PERMISSIONS
    assert identity.operator is True


def test_the_operator_creates_and_lists_spaces(operator: Runstate) -> None:
    named = operator.spaces.create(id=unique("acme"), name="Acme Corp")
    assert isinstance(named, SpaceInfo)
    assert named.name == "Acme Corp" and recent(named.created_at)
    generated = operator.spaces.create()
    assert generated.id.startswith("spc_") and generated.name is None

    listed = {space.id: space for space in operator.spaces.list()}
    assert {named.id, generated.id, OPERATOR_SPACE} <= set(listed)
    assert listed[named.id] == named

    with pytest.raises(ConflictError) as conflict:
        operator.spaces.create(id=named.id)
    assert conflict.value.code == "CONFLICT" and conflict.value.status == 409


def test_a_new_key_works_at_once_lists_without_its_secret_and_stops_when_revoked(
    auth_node: tuple[DevNode, str],
) -> None:
    node, secret = auth_node

    async def main() -> None:
        async with AsyncRunstate(base_url=node.url, api_key=secret) as operator:
            me = await operator.whoami()
            space = await operator.spaces.create(id=unique("squad"), name="Squad")
            created = await operator.keys.create(
                ["coordination_write", "coordination_read"], space=space.id, name="worker"
            )
            assert isinstance(created, NewKey)
            assert created.secret.startswith("rsk_") and created.secret not in repr(created)
            assert created.id.startswith("key_") and created.space == space.id and created.name == "worker"
            # The server lists permissions in PERMISSIONS order, whatever order they were given in.
            assert created.permissions == ("coordination_write", "coordination_read")
            assert created.revoked_at is None and created.created_by == me.key_id and recent(created.created_at)

            async with AsyncRunstate(base_url=node.url, api_key=created.secret) as worker:
                identity = await worker.whoami()
                assert identity == Identity(
                    auth=True, key_id=created.id, space=space.id, permissions=created.permissions, operator=False
                )

                keys = await operator.keys.list(space=space.id)
                assert [key.id for key in keys] == [created.id]
                assert type(keys[0]) is KeyInfo and not hasattr(keys[0], "secret")
                assert keys[0] == KeyInfo(**{name: getattr(created, name) for name in KeyInfo.__dataclass_fields__})

                revoked = await operator.keys.revoke(created.id)
                assert revoked.id == created.id and revoked.revoked_at is not None and recent(revoked.revoked_at)
                with pytest.raises(UnauthenticatedError) as refused:
                    await worker.whoami()
                assert refused.value.code == "UNAUTHENTICATED" and refused.value.status == 401

            # Revoking twice keeps the first time; the list shows the key as revoked.
            assert (await operator.keys.revoke(created.id)).revoked_at == revoked.revoked_at
            (listed,) = await operator.keys.list(space=space.id)
            assert listed.revoked_at == revoked.revoked_at

    asyncio.run(main())


def test_a_space_admin_manages_only_its_own_space(
    auth_node: tuple[DevNode, str], operator: Runstate, space_admin: Runstate
) -> None:
    me = space_admin.whoami()
    assert me.permissions == ("admin",) and me.operator is False
    assert [space.id for space in space_admin.spaces.list()] == [me.space]

    # Its own space's keys: create (the target defaults to its space), list, revoke.
    key = space_admin.keys.create(["coordination_read"])
    assert key.space == me.space and key.created_by == me.key_id
    assert {listed.id for listed in space_admin.keys.list()} == {me.key_id, key.id}
    assert space_admin.keys.revoke(key.id).revoked_at is not None

    with pytest.raises(ForbiddenError):
        space_admin.spaces.create(id=unique("mine"))
    with pytest.raises(ForbiddenError):
        space_admin.keys.list(space=OPERATOR_SPACE)
    with pytest.raises(ForbiddenError):
        space_admin.keys.create(["admin"], space=OPERATOR_SPACE)
    # Another space's key id is unknown to it, as an id that does not exist.
    operator_key_id = operator.whoami().key_id
    assert operator_key_id is not None
    with pytest.raises(NotFoundError):
        space_admin.keys.revoke(operator_key_id)
    with pytest.raises(NotFoundError):
        space_admin.keys.revoke("key_00000000000000000000")
    # A call in another space than the key's is refused.
    reader = space_admin.keys.create(["coordination_read"])
    with Runstate(base_url=auth_node[0].url, api_key=reader.secret, space_id=OPERATOR_SPACE) as elsewhere:
        assert elsewhere.whoami().space == me.space  # whoami names the key's own space
        with pytest.raises(ForbiddenError):
            elsewhere.scopes.status("run_x")
    with Runstate(base_url=auth_node[0].url, api_key=reader.secret, space_id=me.space) as at_home:
        with pytest.raises(NotFoundError):
            at_home.scopes.status("run_x")


def test_the_operator_manages_the_keys_of_any_space(operator: Runstate, space_admin: Runstate) -> None:
    space = space_admin.whoami().space
    key = operator.keys.create(["resource_config"], space=space)
    assert key.space == space
    assert key.id in {listed.id for listed in space_admin.keys.list()}
    assert operator.keys.revoke(key.id).revoked_at is not None
    with pytest.raises(NotFoundError):
        operator.keys.create(["admin"], space=unique("nowhere"))


def test_a_key_without_admin_is_forbidden(auth_node: tuple[DevNode, str], space_admin: Runstate) -> None:
    key = space_admin.keys.create(["resource_config", "coordination_write", "coordination_read"])
    with Runstate(base_url=auth_node[0].url, api_key=key.secret) as worker:
        assert worker.whoami().key_id == key.id
        with pytest.raises(ForbiddenError) as forbidden:
            worker.keys.list()
        assert forbidden.value.code == "FORBIDDEN" and forbidden.value.status == 403
        assert "admin" in forbidden.value.message
        for call in (
            lambda: worker.keys.create(["coordination_read"]),
            lambda: worker.keys.revoke(key.id),
            worker.spaces.list,
            lambda: worker.spaces.create(id=unique("nope")),
        ):
            with pytest.raises(ForbiddenError):
                call()


def test_missing_and_unknown_keys_are_unauthenticated(auth_node: tuple[DevNode, str]) -> None:
    url = auth_node[0].url
    for api_key in (None, "rsk_" + "x" * 43):
        with Runstate(base_url=url, api_key=api_key) as stranger:
            with pytest.raises(UnauthenticatedError):
                stranger.whoami()
            with pytest.raises(UnauthenticatedError):
                stranger.keys.list()


def test_bad_arguments(operator: Runstate) -> None:
    # The server judges permission names and ids: ValidationError (status 400).
    with pytest.raises(ValidationError) as unknown:
        operator.keys.create(["superuser"])
    assert type(unknown.value) is ValidationError and unknown.value.status == 400
    with pytest.raises(ValidationError) as malformed:
        operator.spaces.create(id="no/slashes")
    assert type(malformed.value) is ValidationError
    # The SDK refuses what cannot be a call at all before sending it: ConfigError (no status).
    for permissions in ([], "admin", [""], [None]):
        with pytest.raises(ConfigError) as local:
            operator.keys.create(permissions)  # type: ignore[arg-type]
        assert local.value.status is None
    for call in (
        lambda: operator.keys.revoke(""),
        lambda: operator.keys.list(space=""),
        lambda: operator.spaces.create(id=""),
        lambda: operator.keys.create(["admin"], name=""),
    ):
        with pytest.raises(ConfigError):
            call()


def test_a_node_without_auth_allows_everything_but_minting_keys(node_factory: Any) -> None:
    node = node_factory(in_memory=True).start()
    with Runstate(base_url=node.url) as rs:
        assert rs.whoami() == Identity(
            auth=False, key_id=None, space=OPERATOR_SPACE, permissions=PERMISSIONS, operator=True
        )
        space = rs.spaces.create(id=unique("dev")).id
        with Runstate(base_url=node.url, space_id=space) as in_space:
            # A key made here would be valid once the node restarts with --auth (tests/test_node_guard.py).
            with pytest.raises(ConflictError) as refused:
                in_space.keys.create(["coordination_read"])
            assert refused.value.code == "AUTH_DISABLED"
            assert in_space.keys.list() == []


def test_the_sdk_knows_the_servers_permissions() -> None:
    from runstate_server.actors import access

    assert PERMISSIONS == access.PERMISSIONS
