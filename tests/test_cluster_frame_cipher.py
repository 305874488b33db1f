"""The Raft port's frame cipher makes and reads the same tokens as cryptography's Fernet, which
pysyncobj uses on nodes without it; the transport's frames still read with pysyncobj's own code;
between nodes that both read them, frames are AES-GCM, and a node of an earlier release (which reads
Fernet tokens only) gets Fernet tokens only."""

from __future__ import annotations

import itertools
import zlib

import pytest
from cryptography.fernet import Fernet, InvalidToken
from hypothesis import given
from hypothesis import strategies as st
from pysyncobj.encryptor import getEncryptor
from pysyncobj.poller import createPoller

from runstate_server.cluster._frame_cipher import (
    AEAD_MARKER,
    FRAMES_AEAD,
    FRAMES_FERNET,
    NONCE_COUNTER_MAX,
    AeadFrameCipher,
    FrameCipher,
    InvalidFrame,
    frame_ciphers,
)
from runstate_server.cluster._transport import (
    FRAME_DEFLATE_BYTES_MIN,
    ZLIB_LOOKAHEAD_BYTES,
    BoundedConnection,
    _frame_body,
)
from tests._nodes import free_port

FERNET = getEncryptor("the cluster password")
OTHER = getEncryptor("another password")
ANOTHER_NODE = getEncryptor("the cluster password")  # each node derives the key from the password on its own
timestamps = st.integers(min_value=0, max_value=2**63 - 1)


@given(st.binary(max_size=4096), timestamps)
def test_fernet_reads_what_it_seals(data: bytes, timestamp: int) -> None:
    token = FrameCipher(FERNET).seal(data, timestamp)
    assert FERNET.extract_timestamp(token) == timestamp
    assert FERNET.decrypt(token) == data


@given(st.binary(max_size=4096), timestamps)
def test_it_reads_what_fernet_encrypts(data: bytes, timestamp: int) -> None:
    assert FrameCipher(FERNET).open(FERNET.encrypt_at_time(data, timestamp)) == (timestamp, data)


@given(st.binary(min_size=1, max_size=512), st.data())
def test_a_changed_token_is_refused_as_fernet_refuses_it(data: bytes, draw: st.DataObject) -> None:
    token = bytearray(FERNET.encrypt_at_time(data, 7))
    position = draw.draw(st.integers(min_value=0, max_value=len(token) - 1))
    replacement = draw.draw(st.sampled_from(b"ABCDEFabcdef0123456789-_=!"))
    token[position] = replacement
    try:
        expected: bytes | None = FERNET.decrypt(bytes(token))
    except InvalidToken:
        expected = None
    try:
        got: bytes | None = FrameCipher(FERNET).open(bytes(token))[1]
    except InvalidFrame:
        got = None
    assert got == expected


@pytest.mark.parametrize("token", [b"", b"garbage", b"gAAAAA", b"\xff\xfe", b"cut short"])
def test_garbage_is_refused(token: bytes) -> None:
    if token == b"cut short":
        token = FERNET.encrypt(b"x")[:-4]  # made here: a token's IV is random, a test id may not be
    with pytest.raises(InvalidFrame):
        FrameCipher(FERNET).open(token)


def test_another_password_is_refused() -> None:
    with pytest.raises(InvalidFrame):
        FrameCipher(FERNET).open(OTHER.encrypt(b"hello"))
    with pytest.raises(InvalidToken):
        OTHER.decrypt(FrameCipher(FERNET).seal(b"hello", 1))


def test_without_fernets_key_attributes_it_uses_fernet_itself() -> None:
    class Renamed(Fernet):
        """A Fernet whose key lives under other names."""

        def __init__(self, key: bytes) -> None:  # no super().__init__: no _signing_key
            self._inner = Fernet(key)

        def encrypt_at_time(self, data: bytes, current_time: int) -> bytes:
            return self._inner.encrypt_at_time(data, current_time)

        def extract_timestamp(self, token: bytes | str) -> int:
            return self._inner.extract_timestamp(token)

        def decrypt(self, token: bytes | str, ttl: int | None = None) -> bytes:
            return self._inner.decrypt(token, ttl)

    renamed = Renamed(Fernet.generate_key())
    ciphers = frame_ciphers(renamed)
    assert not isinstance(ciphers.fernet, FrameCipher)
    # Without Fernet's key there is no AES-GCM key either: it reads and sends Fernet tokens only.
    assert ciphers.aead is None and ciphers.formats == FRAMES_FERNET
    assert ciphers.open(renamed.encrypt_at_time(b"data", 9)) == (9, b"data")
    assert renamed.decrypt(ciphers.seal(b"more", 10, formats=FRAMES_AEAD)) == b"more"
    with pytest.raises(InvalidFrame):
        ciphers.open(FERNET.encrypt(b"x"))
    with pytest.raises(InvalidFrame):
        ciphers.open(frame_ciphers(FERNET).seal(b"x", 1, formats=FRAMES_AEAD))


def test_one_cipher_per_encryptor() -> None:
    assert frame_ciphers(FERNET) is frame_ciphers(FERNET)
    assert frame_ciphers(FERNET) is not frame_ciphers(OTHER)


# AES-GCM frames (format 2).

def aead(fernet: Fernet = FERNET) -> AeadFrameCipher:
    cipher = frame_ciphers(fernet).aead
    assert cipher is not None
    return cipher


@given(st.binary(max_size=4096), timestamps)
def test_another_node_of_the_cluster_reads_an_aes_gcm_frame(data: bytes, timestamp: int) -> None:
    other_node = ANOTHER_NODE
    frame = aead().seal(data, timestamp)
    assert frame[0] == AEAD_MARKER
    assert aead(other_node).open(frame) == (timestamp, data)
    assert frame_ciphers(other_node).open(frame) == (timestamp, data)


@given(st.binary(min_size=1, max_size=512), st.data())
def test_a_changed_aes_gcm_frame_is_refused(data: bytes, draw: st.DataObject) -> None:
    frame = bytearray(aead().seal(data, 7))
    position = draw.draw(st.integers(min_value=0, max_value=len(frame) - 1))
    flip = draw.draw(st.integers(min_value=1, max_value=255))
    frame[position] ^= flip
    with pytest.raises(InvalidFrame):
        frame_ciphers(FERNET).open(bytes(frame))


@pytest.mark.parametrize("frame", [b"\x02", b"\x02" + b"\x00" * 36, b"\x02garbage" * 10])
def test_aes_gcm_garbage_and_short_frames_are_refused(frame: bytes) -> None:
    with pytest.raises(InvalidFrame):
        frame_ciphers(FERNET).open(frame)


def test_another_password_cannot_read_an_aes_gcm_frame() -> None:
    with pytest.raises(InvalidFrame):
        aead(OTHER).open(aead().seal(b"hello", 1))


def test_a_frame_is_sealed_in_the_newest_format_both_ends_read_and_either_is_read() -> None:
    ciphers = frame_ciphers(getEncryptor("the cluster password"))
    before = dict(ciphers.sealed)
    token = ciphers.seal(b"to an older release", 3, formats=FRAMES_FERNET)
    assert FERNET.decrypt(token) == b"to an older release"  # what pysyncobj's own code reads
    frame = ciphers.seal(b"to a peer that reads format 2", 4, formats=FRAMES_AEAD)
    assert frame[0] == AEAD_MARKER
    assert ciphers.open(token) == (3, b"to an older release")
    assert ciphers.open(frame) == (4, b"to a peer that reads format 2")
    assert ciphers.sealed == {"fernet": before["fernet"] + 1, "aead": before["aead"] + 1}


def test_aes_gcm_nonces_never_repeat_and_a_spent_counter_starts_a_new_prefix() -> None:
    cipher = AeadFrameCipher(b"k" * 32)
    nonces = [cipher.seal(b"same", 1)[1:13] for _ in range(3)]
    assert len(set(nonces)) == 3
    assert {nonce[:8] for nonce in nonces} == {nonces[0][:8]}
    assert [int.from_bytes(nonce[8:], "big") for nonce in nonces] == [0, 1, 2]
    cipher._nonces = (cipher._nonces[0], itertools.count(NONCE_COUNTER_MAX - 1))  # as after 2**32 - 1 frames
    last = cipher.seal(b"same", 1)[1:13]
    assert last == nonces[0][:8] + (NONCE_COUNTER_MAX - 1).to_bytes(4, "big")
    after = cipher.seal(b"same", 1)[1:13]
    assert after[:8] != nonces[0][:8] and int.from_bytes(after[8:], "big") == 0
    assert AeadFrameCipher(b"k" * 32).open(cipher.seal(b"still read", 2)) == (2, b"still read")


@pytest.mark.parametrize("size", [0, 1, FRAME_DEFLATE_BYTES_MIN - 1, FRAME_DEFLATE_BYTES_MIN, 1500, 20_000, 100_000])
def test_frame_bodies_inflate_as_pysyncobj_reads_them(size: int) -> None:
    pickled = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    body = _frame_body(pickled)
    assert zlib.decompress(body) == pickled
    # The stream's window is the smallest that reaches back over the body (zlib's header says
    # which: CMF's high nibble is its log2 less 8), so no frame pays for zlib's 32 KiB default.
    assert body[0] >> 4 == max(9, min(15, (size + ZLIB_LOOKAHEAD_BYTES).bit_length())) - 8
    if size >= FRAME_DEFLATE_BYTES_MIN:
        assert len(body) < size  # deflated: the very bytes pysyncobj's zlib.compress(body, 3) makes, but the header
        assert body[2:] == zlib.compress(pickled, 3)[2:]


def test_a_connection_made_again_sends_fernet_until_its_peer_tells_its_formats_again() -> None:
    # The outgoing connection object is reused for every reconnection, and the peer may run an
    # earlier release by then.
    poller = createPoller("auto")
    connection = BoundedConnection(poller=poller, timeout=1.0, sendBufferSize=2**16, recvBufferSize=2**16, keepalive=None)
    assert connection.peer_formats == FRAMES_FERNET
    connection.peer_formats = FRAMES_AEAD  # its peer told it so (BoundedTransport, LEVEL)
    connection.connect("127.0.0.1", free_port())
    try:
        assert connection.peer_formats == FRAMES_FERNET
    finally:
        connection.disconnect()
