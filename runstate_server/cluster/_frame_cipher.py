"""The Raft port's frame encryption, in the format pysyncobj's peers send and expect, for less CPU.

pysyncobj encrypts every frame with `cryptography`'s Fernet (AES-128-CBC, then HMAC-SHA256 over
version, timestamp, IV and ciphertext, base64url). Reading a frame it calls `extract_timestamp`
and then `decrypt`: two base64 decodings and two HMAC checks of the whole frame, through several
layers of Python objects; a small frame cost ~22 µs to read and ~17 µs to write, and every Raft
message (an append, its answer, a heartbeat, a read index round) pays both on each node.
`FrameCipher` makes and reads the very same tokens in one pass each: one base64 step, one HMAC
(the standard library's one-shot `hmac.digest`), one AES pass. The format is Fernet's, unchanged,
so a node with this code and one without talk as before; tests/test_cluster_frame_cipher.py holds
it to `cryptography`'s own Fernet both ways.
"""

from __future__ import annotations

import binascii
import hmac
import os
import weakref

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

_VERSION = 0x80  # Fernet's version byte
_TIMESTAMP_BYTES = 8
_IV_BYTES = 16
_MAC_BYTES = 32
_BLOCK_BYTES = 16  # AES's block: the PKCS7 padding pads to it
_HEADER_BYTES = 1 + _TIMESTAMP_BYTES + _IV_BYTES
_TOKEN_BYTES_MIN = _HEADER_BYTES + _BLOCK_BYTES + _MAC_BYTES  # an empty plaintext still pads one block
# base64url <-> standard base64 (binascii speaks the latter).
_TO_URLSAFE = bytes.maketrans(b"+/", b"-_")
_FROM_URLSAFE = bytes.maketrans(b"-_", b"+/")


class InvalidFrame(Exception):
    """Not a token of this cluster's key: garbage, tampered, or another password."""


class FrameCipher:
    """Fernet tokens under one Fernet key (the cluster password's)."""

    def __init__(self, fernet: Fernet) -> None:
        # Fernet's own halves of its key: private attributes of cryptography's class, the same
        # since its first release (the tests check the tokens against Fernet itself; frame_cipher
        # falls back to Fernet's methods should a release rename them).
        self._signing_key: bytes = fernet._signing_key
        self._aes = algorithms.AES(fernet._encryption_key)

    def seal(self, data: bytes, timestamp: int) -> bytes:
        """What `Fernet.encrypt_at_time(data, timestamp)` gives (with its own random IV)."""
        iv = os.urandom(_IV_BYTES)
        pad = _BLOCK_BYTES - len(data) % _BLOCK_BYTES
        encryptor = Cipher(self._aes, modes.CBC(iv)).encryptor()
        ciphertext = encryptor.update(data + bytes((pad,)) * pad) + encryptor.finalize()
        parts = b"".join((bytes((_VERSION,)), timestamp.to_bytes(_TIMESTAMP_BYTES, "big"), iv, ciphertext))
        mac = hmac.digest(self._signing_key, parts, "sha256")
        return binascii.b2a_base64(parts + mac, newline=False).translate(_TO_URLSAFE)

    def open(self, token: bytes) -> tuple[int, bytes]:
        """The token's timestamp and plaintext, as `Fernet.extract_timestamp` and `Fernet.decrypt`
        (without a ttl) give them; InvalidFrame where they raise InvalidToken."""
        try:
            raw = binascii.a2b_base64(token.translate(_FROM_URLSAFE))
        except (binascii.Error, TypeError) as error:
            raise InvalidFrame("not base64") from error
        if len(raw) < _TOKEN_BYTES_MIN or raw[0] != _VERSION or (len(raw) - _HEADER_BYTES - _MAC_BYTES) % _BLOCK_BYTES:
            raise InvalidFrame("not a Fernet token")
        view = memoryview(raw)
        if not hmac.compare_digest(hmac.digest(self._signing_key, view[:-_MAC_BYTES], "sha256"), view[-_MAC_BYTES:]):
            raise InvalidFrame("wrong signature")
        decryptor = Cipher(self._aes, modes.CBC(raw[1 + _TIMESTAMP_BYTES:_HEADER_BYTES])).decryptor()
        padded = decryptor.update(view[_HEADER_BYTES:-_MAC_BYTES]) + decryptor.finalize()
        pad = padded[-1]
        # Signed by the key's holder, so no padding oracle to fear; still refused as Fernet does.
        if not 1 <= pad <= _BLOCK_BYTES or padded[-pad:] != bytes((pad,)) * pad:
            raise InvalidFrame("bad padding")
        return int.from_bytes(raw[1:1 + _TIMESTAMP_BYTES], "big"), padded[:-pad]


class _FernetCipher:
    """FrameCipher's interface on Fernet's own methods (pysyncobj's way: twice the work to read)."""

    def __init__(self, fernet: Fernet) -> None:
        self._fernet = fernet

    def seal(self, data: bytes, timestamp: int) -> bytes:
        return self._fernet.encrypt_at_time(data, timestamp)

    def open(self, token: bytes) -> tuple[int, bytes]:
        try:
            return self._fernet.extract_timestamp(token), self._fernet.decrypt(token)
        except InvalidToken as error:
            raise InvalidFrame("not a token of this key") from error


_CIPHERS: weakref.WeakKeyDictionary[Fernet, FrameCipher | _FernetCipher] = weakref.WeakKeyDictionary()


def frame_cipher(fernet: Fernet) -> FrameCipher | _FernetCipher:
    """The cipher of pysyncobj's encryptor (one per SyncObj, shared by its connections)."""
    cipher = _CIPHERS.get(fernet)
    if cipher is None:
        try:
            cipher = FrameCipher(fernet)
        except AttributeError:  # a cryptography release without Fernet's key attributes
            cipher = _FernetCipher(fernet)
        _CIPHERS[fernet] = cipher
    return cipher
