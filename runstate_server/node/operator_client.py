"""A small blocking client of the operator routes (`/v1/whoami`, `/v1/spaces`, `/v1/keys`) for the
`runstate spaces|keys|whoami` commands. The standard library only: the server distribution
depends on no SDK, so either SDK (ours or the published one) installs beside it.

A cluster's nodes may be listed comma-separated: a node that cannot be reached is skipped, and a
write is never sent twice to the same node (a lost answer to a create is an error, never a retry
that could mint a second key).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

BASE_URL_ENV = "RUNSTATE_BASE_URL"
API_KEY_ENV = "RUNSTATE_API_KEY"
BASE_URL_DEFAULT = "http://localhost:8080"
REQUEST_TIMEOUT_S = 10.0  # one request to one node


class OperatorError(Exception):
    """The API refused the call (`code` and `message` of its error envelope), or no node answered
    (`UNAVAILABLE`)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class UsageError(Exception):
    """A malformed --url or the like: the command's usage, not the API's answer."""


def _base_urls(url: str | None) -> list[str]:
    raw = url or os.environ.get(BASE_URL_ENV, "").strip() or BASE_URL_DEFAULT
    urls = []
    for part in raw.split(","):
        candidate = part.strip().rstrip("/")
        parsed = urllib.parse.urlsplit(candidate)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise UsageError(f"--url {candidate!r} must be an http:// or https:// URL with a host")
        urls.append(candidate)
    return urls


class OperatorClient:
    def __init__(self, url: str | None, api_key: str | None) -> None:
        self.base_urls = _base_urls(url)
        self.api_key = api_key or os.environ.get(API_KEY_ENV) or None

    def request(self, method: str, path: str, body: dict[str, Any] | None = None, query: dict[str, str] | None = None) -> Any:
        if query:
            path += "?" + urllib.parse.urlencode(query)
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        failures = []
        for base in self.base_urls:
            request = urllib.request.Request(base + path, data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as answer:  # noqa: S310 - http(s) only
                    return json.loads(answer.read() or b"{}")
            except urllib.error.HTTPError as error:
                raise _api_error(error) from None
            except (urllib.error.URLError, OSError, ValueError) as error:
                failures.append(f"{base}: {error}")
        raise OperatorError("UNAVAILABLE", "no node answered (" + "; ".join(failures) + ")")


def _api_error(error: urllib.error.HTTPError) -> OperatorError:
    try:
        envelope = json.loads(error.read())["error"]
        return OperatorError(str(envelope["code"]), str(envelope["message"]))
    except (ValueError, KeyError, TypeError):
        return OperatorError("UNAVAILABLE", f"the node answered {error.code} without an error envelope")


# `runstate backup` (node/backup_cli.py): a backup streamed from a node into an open file.
BACKUP_TIMEOUT_S = 600.0  # the node forks, writes the file, then streams it
DOWNLOAD_CHUNK_BYTES = 1024 * 1024


def download(base_url: str, path: str, api_key: str | None, out: Any) -> int:
    """GET `path` from the node at `base_url` into the binary file `out`; the bytes written.
    OperatorError when the node refuses it or cannot be reached (UNAVAILABLE)."""
    headers = {"Accept": "*/*"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(base_url + path, method="GET", headers=headers)
    written = 0
    try:
        with urllib.request.urlopen(request, timeout=BACKUP_TIMEOUT_S) as answer:  # noqa: S310 - http(s) only
            while chunk := answer.read(DOWNLOAD_CHUNK_BYTES):
                out.write(chunk)
                written += len(chunk)
    except urllib.error.HTTPError as error:
        raise _api_error(error) from None
    except (urllib.error.URLError, OSError) as error:
        raise OperatorError("UNAVAILABLE", f"{base_url}: {error}") from None
    return written
