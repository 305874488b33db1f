"""One HTTP request with exactly the bytes a test gives (headers of any bytes, a Host of its choice,
no Content-Type unless named), for the tests of what a node makes of malformed input."""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

TIMEOUT_S = 30.0


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    @property
    def code(self) -> str | None:
        """The error envelope's code (None for an answer that is not an error envelope)."""
        try:
            payload = self.json()
        except ValueError:
            return None
        if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
            code = payload["error"].get("code")
            return code if isinstance(code, str) else None
        return None


def send(
    base_url: str, method: str, path: str, body: bytes | None = None, headers: dict[str, bytes | str] | None = None
) -> Answer:
    """Send one request on a connection of its own. `headers` go out as given (a `Host` among them
    replaces the real one); a body gets its Content-Length and no Content-Type of its own."""
    address = urlsplit(base_url)
    connection = http.client.HTTPConnection(address.hostname or "127.0.0.1", address.port, timeout=TIMEOUT_S)
    try:
        given = {name.lower() for name in headers or {}}
        connection.putrequest(method, path, skip_host="host" in given, skip_accept_encoding=True)
        for name, value in (headers or {}).items():
            connection.putheader(name, value)
        if body is not None:
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return Answer(response.status, dict(response.getheaders()), response.read())
    finally:
        connection.close()


def json_headers(key: str | None = None, **extra: bytes | str) -> dict[str, bytes | str]:
    headers: dict[str, bytes | str] = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return {**headers, **extra}
