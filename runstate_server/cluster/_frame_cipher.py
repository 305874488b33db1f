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

The key is the cluster password's, derived here as pysyncobj derives its Fernet key (PBKDF2-SHA256
with pysyncobj's salt; the Fernet specification: the first 16 bytes sign, the last 16 encrypt),
with `cryptography`'s public API only: nothing reads a Fernet object's private attributes, which
`cryptography` 51 no longer has. `FrameCiphers.check_against` proves at start, through Fernet's
public methods, that pysyncobj's own encryptor reads what this key seals.

Between two nodes that both read them, frames are AES-256-GCM instead (`AeadFrameCipher`, format 2):
one authenticated encryption call each way, no HMAC, no padding, no base64. Sealing and opening a
Fernet token creates an AES context and an HMAC context per frame, which in a node (each frame
handled by a thread just woken, its caches cold) cost far more than in a loop: in the least a
three-node write can take (`bench.floor`'s replication behind an aiohttp server), Fernet frames
added ~0.3 ms at the median, AES-GCM ~0.1. A node tells each peer the frame formats it reads with
its command level (`_transport.py`, `LEVEL`'s `frames`), and sends a peer format 2 only once that
peer told it reads it; it reads both formats from anyone, by the first byte (a Fernet token's is
always b"g"). A node of an earlier release tells no format and receives Fernet tokens only.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hmac
import itertools
import os
import threading

from cryptography.exceptions import InvalidTag
from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC

from runstate_server.cluster._pysyncobj import ENCRYPTOR_SALT

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


# Frame formats a node reads (told to each peer with its command level): Fernet tokens, which every
# release reads, and AES-256-GCM frames.
FRAMES_FERNET = 1
FRAMES_AEAD = 2
AEAD_MARKER = 0x02  # an AES-GCM frame's first byte; a Fernet token's is always b"g" (base64 of 0x80)
_AEAD_MARKER_BYTES = bytes((AEAD_MARKER,))
AEAD_KEY_INFO = b"runstate raft frames, format 2: AES-256-GCM"
_AEAD_KEY_BYTES = 32
_NONCE_PREFIX_BYTES = 8  # random, per cipher (a process's SyncObj): nonces never repeat across processes
_NONCE_COUNTER_BYTES = 4  # then a counter; at its end a new random prefix
NONCE_COUNTER_MAX = 1 << (8 * _NONCE_COUNTER_BYTES)
_NONCE_BYTES = _NONCE_PREFIX_BYTES + _NONCE_COUNTER_BYTES
_TAG_BYTES = 16
_AEAD_FRAME_BYTES_MIN = 1 + _NONCE_BYTES + _TIMESTAMP_BYTES + _TAG_BYTES


# pysyncobj's key derivation (encryptor.getEncryptor): PBKDF2-HMAC-SHA256 of the password, with its
# salt, into Fernet's 32 key bytes.
KEY_ITERATIONS = 100_000
_KEY_BYTES = 32
_SIGNING_KEY_BYTES = 16  # Fernet's key: the signing key, then the encryption key
# Passwords whose key is kept (a process runs one node; tests run a few, with a few passwords).
CLUSTER_KEYS_CACHED_MAX = 8


@functools.lru_cache(maxsize=CLUSTER_KEYS_CACHED_MAX)
def cluster_key(password: str | bytes) -> bytes:
    """The 32 bytes pysyncobj's Fernet key encodes, for this password (~0.1 s: cached)."""
    secret = password if isinstance(password, bytes) else password.encode()
    kdf = PBKDF2HMAC(algorithm=hashes.SHA256(), length=_KEY_BYTES, salt=ENCRYPTOR_SALT, iterations=KEY_ITERATIONS)
    return kdf.derive(secret)


def fernet_key(password: str | bytes) -> bytes:
    """The Fernet key pysyncobj makes of this password (base64url, as `Fernet(key)` takes it)."""
    return base64.urlsafe_b64encode(cluster_key(password))


class KeyMismatch(Exception):
    """pysyncobj's encryptor does not read what this module seals: pysyncobj derives its key in
    another way than the release this module was written for."""


class InvalidFrame(Exception):
    """Not a token of this cluster's key: garbage, tampered, or another password."""


class FrameCipher:
    """Fernet tokens under one Fernet key (its 32 bytes: `cluster_key`)."""

    def __init__(self, key: bytes) -> None:
        assert len(key) == _KEY_BYTES
        self._signing_key = key[:_SIGNING_KEY_BYTES]
        self._aes = algorithms.AES(key[_SIGNING_KEY_BYTES:])

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


class AeadFrameCipher:
    """Format 2: AEAD_MARKER, a 12-byte nonce, then the timestamp (8 bytes, big-endian) and the data
    sealed together with AES-256-GCM under a key derived (HKDF-SHA256) from the Fernet key's 32
    bytes, so from the same cluster password (the same key as the releases before). The nonce is
    a random prefix and a counter: it never repeats under the key (a random nonce per frame would
    reach the bound on random GCM nonces, 2**32 frames, within days on a busy cluster)."""

    def __init__(self, cluster_key: bytes) -> None:
        key = HKDF(algorithm=hashes.SHA256(), length=_AEAD_KEY_BYTES, salt=None, info=AEAD_KEY_INFO).derive(cluster_key)
        self._aead = AESGCM(key)
        self._lock = threading.Lock()  # only to start a new prefix; `next` on a count is atomic
        # A prefix and its counter, replaced together: a number is only ever used with its own prefix.
        self._nonces = (os.urandom(_NONCE_PREFIX_BYTES), itertools.count())

    def _nonce(self) -> bytes:
        prefix, counter = self._nonces
        number = next(counter)
        if number < NONCE_COUNTER_MAX:
            return prefix + number.to_bytes(_NONCE_COUNTER_BYTES, "big")
        with self._lock:
            if self._nonces[1] is counter:  # spent: a new prefix (once, whichever caller comes first)
                self._nonces = (os.urandom(_NONCE_PREFIX_BYTES), itertools.count())
        return self._nonce()

    def seal(self, data: bytes, timestamp: int) -> bytes:
        nonce = self._nonce()
        sealed = self._aead.encrypt(nonce, timestamp.to_bytes(_TIMESTAMP_BYTES, "big") + data, None)
        return _AEAD_MARKER_BYTES + nonce + sealed

    def open(self, frame: bytes) -> tuple[int, bytes]:
        if len(frame) < _AEAD_FRAME_BYTES_MIN or frame[0] != AEAD_MARKER:
            raise InvalidFrame("not an AES-GCM frame")
        view = memoryview(frame)
        try:
            plain = self._aead.decrypt(view[1:1 + _NONCE_BYTES], view[1 + _NONCE_BYTES:], None)
        except InvalidTag as error:
            raise InvalidFrame("wrong tag") from error
        return int.from_bytes(plain[:_TIMESTAMP_BYTES], "big"), plain[_TIMESTAMP_BYTES:]


class FrameCiphers:
    """Both formats under one cluster password, and the frames sealed in each (`sealed`, read by
    the node's metrics). One per node (its transport): the counts are the node's. `aead` is None
    on a node that plays a release before format 2 (a test's)."""

    def __init__(self, password: str | bytes) -> None:
        key = cluster_key(password)
        self.fernet = FrameCipher(key)
        self.aead: AeadFrameCipher | None = AeadFrameCipher(key)
        self.formats = FRAMES_AEAD  # the newest it reads
        self.sealed = {"fernet": 0, "aead": 0}  # fixed keys: the loop copies it while the tick thread counts

    def check_against(self, encryptor: Fernet, timestamp: int) -> None:
        """KeyMismatch unless `encryptor` (pysyncobj's, made of the same password) reads a token
        sealed here and seals one read here: Fernet's public methods only."""
        probe = b"runstate: the frame key matches pysyncobj's"
        try:
            theirs = encryptor.decrypt(self.fernet.seal(probe, timestamp))
            ours = self.fernet.open(encryptor.encrypt_at_time(probe, timestamp))[1]
        except (InvalidToken, InvalidFrame) as error:
            raise KeyMismatch(
                "pysyncobj's encryptor does not read the Raft frames this node seals: its key derivation "
                "is not the one runstate was built for (runstate_server/cluster/_frame_cipher.py)"
            ) from error
        if theirs != probe or ours != probe:
            raise KeyMismatch("pysyncobj's encryptor and this node's frame cipher disagree on a token")

    def seal(self, data: bytes, timestamp: int, *, formats: int) -> bytes:
        """`data` in the newest format both this node and a peer that reads `formats` read."""
        if formats >= FRAMES_AEAD and self.aead is not None:
            self.sealed["aead"] += 1
            return self.aead.seal(data, timestamp)
        self.sealed["fernet"] += 1
        return self.fernet.seal(data, timestamp)

    def open(self, frame: bytes) -> tuple[int, bytes]:
        """A frame of either format, told apart by its first byte."""
        if frame[:1] == _AEAD_MARKER_BYTES and self.aead is not None:
            return self.aead.open(frame)
        return self.fernet.open(frame)

