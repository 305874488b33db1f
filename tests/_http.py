"""A tiny blocking JSON client for API tests (deliberately not the SDK)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

TIMEOUT_S = 60.0


def call(base_url: str, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(base_url + path, data=data, method=method, headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        payload = error.read()
        error.close()
        return error.code, json.loads(payload or b"null")


# Routes outside any space; every other `/v1/...` path a test names is sent under the space,
# `/v1/spaces/{space}/...`.
OPERATOR_PATHS = ("/v1/health", "/v1/cluster", "/v1/openapi.json", "/v1/whoami", "/v1/spaces", "/v1/keys")
DEFAULT_SPACE = "default"  # a node's default space (NodeConfig.default_space)


class Api:
    """Calls in one space: `space`, else the key's space, else the default space."""

    def __init__(self, base_url: str, space: str | None = None, key: str | None = None) -> None:
        self.base_url = base_url
        self.headers: dict[str, str] = {}
        if key is not None:
            self.headers["Authorization"] = f"Bearer {key}"
        self.space = space

    def space_path(self, path: str) -> str:
        if not path.startswith("/v1/") or path.startswith(OPERATOR_PATHS):
            return path
        if self.space is None:
            status, identity = call(self.base_url, "GET", "/v1/whoami", headers=self.headers)
            self.space = identity["space"] if status == 200 else DEFAULT_SPACE
        return f"/v1/spaces/{self.space}/{path[len('/v1/'):]}"

    def __call__(self, method: str, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
        return call(self.base_url, method, self.space_path(path), body, headers=self.headers, **kwargs)

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = self(method, path, body)
        assert 200 <= status < 300, (status, answer)
        return answer

    def error(self, method: str, path: str, body: Any = None, **kwargs: Any) -> tuple[int, str]:
        status, answer = self(method, path, body, **kwargs)
        assert status >= 400, (status, answer)
        return status, answer["error"]["code"]


def configured_run(base_url: str) -> Iterator[str]:
    """A fresh run that the module-level API of this process (`runstate.once`, `runstate.queue`)
    uses until the generator ends; for a fixture to `yield from`."""
    import runstate

    scope_id = str(Api(base_url).ok("POST", "/v1/scopes", {})["id"])
    runstate.configure(base_url=base_url, scope_id=scope_id)
    try:
        yield scope_id
    finally:
        runstate.close()
