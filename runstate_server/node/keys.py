"""API key secrets, ids and hashes: made by the node (bootstrap, `POST /v1/keys`), never by the core,
which keeps only the hash."""

from __future__ import annotations

import hashlib
import secrets

KEY_SECRET_PREFIX = "rsk_"
KEY_SECRET_BYTES = 32  # 256 random bits
KEY_ID_HEX_CHARS = 20


def new_key_secret() -> str:
    return KEY_SECRET_PREFIX + secrets.token_urlsafe(KEY_SECRET_BYTES)


def new_key_id() -> str:
    return "key_" + secrets.token_hex(KEY_ID_HEX_CHARS // 2)


def key_hash(secret: str) -> str:
    """What the state keeps of a key: its SHA-256 (a 256-bit random secret needs no slow hash)."""
    return hashlib.sha256(secret.encode()).hexdigest()
