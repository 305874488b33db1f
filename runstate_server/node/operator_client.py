"""A small blocking client of the operator routes (`/v1/whoami`, `/v1/spaces`, `/v1/keys`) for the
`runstate spaces|keys|whoami` commands. The standard library only: the server distribution
depends on no SDK, so either SDK (ours or the published one) installs beside it.

A cluster's nodes may be listed comma-separated: a node that cannot be reached is skipped, and a
write is never sent twice to the same node (a lost answer to a create is an error, never a retry
that could mint a second key).

https:// URLs are verified against the system's CAs, or only against `--ca-file` (RUNSTATE_CA_FILE,
as the SDKs read it) when given; `--client-cert` with `--client-key` (RUNSTATE_CLIENT_CERT,
RUNSTATE_CLIENT_KEY) is presented to a node that requires client certificates (mutual TLS). A TLS
failure (a certificate not trusted, a handshake refused) is not skipped like a node that is down:
it is a setting to fix, so it ends the command at once with code TLS, naming the URL and the reason.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

BASE_URL_ENV = "RUNSTATE_BASE_URL"
API_KEY_ENV = "RUNSTATE_API_KEY"
BASE_URL_DEFAULT = "http://localhost:8080"
REQUEST_TIMEOUT_S = 10.0  # one request to one node
# The SDKs' TLS settings (issue 42), read the same way here.
CA_FILE_ENV = "RUNSTATE_CA_FILE"
CLIENT_CERT_ENV = "RUNSTATE_CLIENT_CERT"
CLIENT_KEY_ENV = "RUNSTATE_CLIENT_KEY"
TLS_ERROR_CODE = "TLS"  # OperatorError.code of a TLS failure (not the API's: the call never reached it)


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


def tls_context(ca_file: str | None = None, client_cert: str | None = None, client_key: str | None = None) -> ssl.SSLContext:
    """The context https:// URLs are opened with: the flags', else the environment's CA file (only
    its CAs are trusted then; without one, the system's) and client certificate. UsageError (one
    line, naming the flag and its variable) for a file that cannot be read or is not PEM, or a
    certificate without its key."""
    ca_file = ca_file or os.environ.get(CA_FILE_ENV) or None
    client_cert = client_cert or os.environ.get(CLIENT_CERT_ENV) or None
    client_key = client_key or os.environ.get(CLIENT_KEY_ENV) or None
    if (client_cert is None) != (client_key is None):
        raise UsageError(
            f"--client-cert ({CLIENT_CERT_ENV}) and --client-key ({CLIENT_KEY_ENV}) go together: give both, or neither"
        )
    for path, flag, variable in (
        (ca_file, "--ca-file", CA_FILE_ENV), (client_cert, "--client-cert", CLIENT_CERT_ENV),
        (client_key, "--client-key", CLIENT_KEY_ENV),
    ):
        if path is not None and not os.access(path, os.R_OK):
            raise UsageError(f"{flag} ({variable}) {path}: cannot read it")
    try:
        context = ssl.create_default_context(cafile=ca_file)
    except ssl.SSLError as error:
        raise UsageError(f"--ca-file ({CA_FILE_ENV}) {ca_file}: not PEM CA certificates ({error.reason or error})") from None
    if client_cert is not None:
        try:
            context.load_cert_chain(client_cert, client_key)
        except ssl.SSLError as error:
            raise UsageError(
                f"--client-cert {client_cert} with --client-key {client_key}: not a PEM certificate and its matching "
                f"private key ({error.reason or error})"
            ) from None
    return context


def _tls_failure(base: str, error: BaseException) -> OperatorError | None:
    """OperatorError(TLS) when `error` (urllib's, or one it let through) is a TLS failure with `base`."""
    reason = error.reason if isinstance(error, urllib.error.URLError) else error
    if isinstance(reason, ssl.SSLCertVerificationError):
        return OperatorError(
            TLS_ERROR_CODE,
            f"{base}: the node's certificate is not trusted ({reason.verify_message or reason.reason}); give the CA "
            f"that signed it with --ca-file or {CA_FILE_ENV}",
        )
    if isinstance(reason, ssl.SSLError):
        why = str(reason.reason or reason)
        give = f"give one its client CA signed with --client-cert and --client-key, or {CLIENT_CERT_ENV} and {CLIENT_KEY_ENV}"
        if "ALERT_CERTIFICATE_REQUIRED" in why:
            return OperatorError(TLS_ERROR_CODE, f"{base}: the node requires a client certificate ({why}): {give}")
        if "ALERT" in why and ("CERTIFICATE" in why or "UNKNOWN_CA" in why):  # the node's alert about ours
            return OperatorError(TLS_ERROR_CODE, f"{base}: the node refused the client certificate ({why}): {give}")
        return OperatorError(TLS_ERROR_CODE, f"{base}: the TLS handshake failed ({why}); is it an https:// node?")
    return None


def _closed_hint(base: str, error: BaseException) -> str:
    """Why an https:// node may close a connection unanswered: with TLS 1.3 a node that requires
    client certificates refuses a missing or foreign one after the client's side of the handshake,
    and a node on Python 3.10 (or of a release before node/_asyncio_tls.py) closes without its
    alert, so the client sees only the close."""
    if base.startswith("https://") and isinstance(error, http.client.RemoteDisconnected):
        return (f" (a node that requires client certificates closes so: give one its client CA signed with "
                f"--client-cert and --client-key, or {CLIENT_CERT_ENV} and {CLIENT_KEY_ENV})")
    return ""


class OperatorClient:
    def __init__(
        self, url: str | None, api_key: str | None, *, ca_file: str | None = None, client_cert: str | None = None,
        client_key: str | None = None,
    ) -> None:
        """UsageError for a malformed URL or TLS file (tls_context)."""
        self.base_urls = _base_urls(url)
        self.api_key = api_key or os.environ.get(API_KEY_ENV) or None
        self.context = tls_context(ca_file, client_cert, client_key)

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
                with urllib.request.urlopen(  # noqa: S310 - http(s) only
                    request, timeout=REQUEST_TIMEOUT_S, context=self.context,
                ) as answer:
                    return json.loads(answer.read() or b"{}")
            except urllib.error.HTTPError as error:
                raise _api_error(error) from None
            except (urllib.error.URLError, OSError, ValueError) as error:
                failure = _tls_failure(base, error)
                if failure is not None:
                    raise failure from None
                failures.append(f"{base}: {error}{_closed_hint(base, error)}")
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


def download(base_url: str, path: str, api_key: str | None, out: Any, context: ssl.SSLContext | None = None) -> int:
    """GET `path` from the node at `base_url` into the binary file `out` (an https:// one verified
    with `context`, an OperatorClient's); the bytes written. OperatorError when the node refuses it,
    TLS fails (TLS) or it cannot be reached (UNAVAILABLE)."""
    headers = {"Accept": "*/*"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(base_url + path, method="GET", headers=headers)
    written = 0
    try:
        with urllib.request.urlopen(request, timeout=BACKUP_TIMEOUT_S, context=context) as answer:  # noqa: S310 - http(s) only
            while chunk := answer.read(DOWNLOAD_CHUNK_BYTES):
                out.write(chunk)
                written += len(chunk)
    except urllib.error.HTTPError as error:
        raise _api_error(error) from None
    except (urllib.error.URLError, OSError) as error:
        raise _tls_failure(base_url, error) or OperatorError("UNAVAILABLE", f"{base_url}: {error}") from None
    return written
