"""The Raft port's frame cipher makes and reads the same tokens as cryptography's Fernet, which
pysyncobj uses on nodes without it; the transport's frames still read with pysyncobj's own code;
between nodes that both read them, frames are AES-GCM, and a node of an earlier release (which reads
Fernet tokens only) gets Fernet tokens only. The key comes from the password by public APIs alone,
and is the very key of the releases before (frames they sealed are read here)."""

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
    FrameCiphers,
    InvalidFrame,
    KeyMismatch,
    cluster_key,
    fernet_key,
)
from runstate_server.cluster._transport import (
    FRAME_DEFLATE_BYTES_MIN,
    ZLIB_LOOKAHEAD_BYTES,
    BoundedConnection,
    _frame_body,
)
from tests._nodes import free_port

PASSWORD = "the cluster password"
FERNET = getEncryptor(PASSWORD)  # pysyncobj's own encryptor, as a node without FrameCipher has it
OTHER = getEncryptor("another password")
CIPHER = FrameCipher(cluster_key(PASSWORD))
timestamps = st.integers(min_value=0, max_value=2**63 - 1)

# Frames sealed by the release before this one (commit 5b63ec1, which took the key from Fernet's
# private attributes, with cryptography 48) under VECTOR_PASSWORD: this release must read them, and
# they it (a rolling upgrade runs both in one cluster).
VECTOR_PASSWORD = "runstate test vector password"
VECTOR_DATA, VECTOR_TIMESTAMP = b"a frame of the release before", 1234567
VECTOR_FERNET_TOKEN = (
    b"gAAAAAAAEtaHuphhj3-k_Cs7bcJBjayQ6BKgDjdkcxnqyfhTeI58KQuCJ1D3SDBGJvF4_G358dnZQoHzIYpf68s1CR1alrAFWgOpw98KFFp8SkJ8D23J4zI="
)
VECTOR_AEAD_FRAME = bytes.fromhex(
    "025e785c39f4d4eb91000000007ea9228f0abaa3db253e0d711699b32177ffa3b5c9f31e784790c4c6c22c2dbef49c11e24d65"
    "2126f9ace7a1dcd040c117ff8d13a1"
)


@given(st.binary(max_size=4096), timestamps)
def test_fernet_reads_what_it_seals(data: bytes, timestamp: int) -> None:
    token = CIPHER.seal(data, timestamp)
    assert FERNET.extract_timestamp(token) == timestamp
    assert FERNET.decrypt(token) == data


@given(st.binary(max_size=4096), timestamps)
def test_it_reads_what_fernet_encrypts(data: bytes, timestamp: int) -> None:
    assert CIPHER.open(FERNET.encrypt_at_time(data, timestamp)) == (timestamp, data)


def test_the_key_is_pysyncobjs_fernet_key() -> None:
    ours = Fernet(fernet_key(PASSWORD))
    assert ours.decrypt(FERNET.encrypt(b"x")) == b"x" and FERNET.decrypt(ours.encrypt(b"y")) == b"y"
    assert cluster_key(PASSWORD) is cluster_key(PASSWORD)  # derived once per password (~0.1 s each)
    assert cluster_key(PASSWORD) != cluster_key("another password")


def test_frames_of_the_release_before_are_read_and_it_reads_ours() -> None:
    ciphers = FrameCiphers(VECTOR_PASSWORD)
    assert ciphers.open(VECTOR_FERNET_TOKEN) == (VECTOR_TIMESTAMP, VECTOR_DATA)
    assert ciphers.open(VECTOR_AEAD_FRAME) == (VECTOR_TIMESTAMP, VECTOR_DATA)
    # An AES-GCM frame opens only under the key it was sealed with: its frame opening here proves
    # the key is the release before's, so it reads what this release seals too (and Fernet tokens
    # are checked against Fernet itself above).
    frame = ciphers.seal(VECTOR_DATA, VECTOR_TIMESTAMP, formats=FRAMES_AEAD)
    assert FrameCiphers(VECTOR_PASSWORD).open(frame) == (VECTOR_TIMESTAMP, VECTOR_DATA)
    with pytest.raises(InvalidFrame):
        FrameCiphers(PASSWORD).open(VECTOR_AEAD_FRAME)


def test_the_key_is_checked_against_pysyncobjs_encryptor() -> None:
    FrameCiphers(PASSWORD).check_against(FERNET, 5)
    with pytest.raises(KeyMismatch, match="key derivation"):
        FrameCiphers(PASSWORD).check_against(OTHER, 5)


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
        got: bytes | None = CIPHER.open(bytes(token))[1]
    except InvalidFrame:
        got = None
    assert got == expected


@pytest.mark.parametrize("token", [b"", b"garbage", b"gAAAAA", b"\xff\xfe", b"cut short"])
def test_garbage_is_refused(token: bytes) -> None:
    if token == b"cut short":
        token = FERNET.encrypt(b"x")[:-4]  # made here: a token's IV is random, a test id may not be
    with pytest.raises(InvalidFrame):
        CIPHER.open(token)


def test_another_password_is_refused() -> None:
    with pytest.raises(InvalidFrame):
        CIPHER.open(OTHER.encrypt(b"hello"))
    with pytest.raises(InvalidToken):
        OTHER.decrypt(CIPHER.seal(b"hello", 1))


def test_each_node_counts_its_own_frames() -> None:
    one, other = FrameCiphers(PASSWORD), FrameCiphers(PASSWORD)
    one.seal(b"x", 1, formats=FRAMES_AEAD)
    assert one.sealed == {"fernet": 0, "aead": 1} and other.sealed == {"fernet": 0, "aead": 0}


# AES-GCM frames (format 2).

def aead(password: str = PASSWORD) -> AeadFrameCipher:
    cipher = FrameCiphers(password).aead
    assert cipher is not None
    return cipher


@given(st.binary(max_size=4096), timestamps)
def test_another_node_of_the_cluster_reads_an_aes_gcm_frame(data: bytes, timestamp: int) -> None:
    frame = aead().seal(data, timestamp)
    assert frame[0] == AEAD_MARKER
    assert aead().open(frame) == (timestamp, data)  # each node derives the key from the password itself
    assert FrameCiphers(PASSWORD).open(frame) == (timestamp, data)


@given(st.binary(min_size=1, max_size=512), st.data())
def test_a_changed_aes_gcm_frame_is_refused(data: bytes, draw: st.DataObject) -> None:
    frame = bytearray(aead().seal(data, 7))
    position = draw.draw(st.integers(min_value=0, max_value=len(frame) - 1))
    flip = draw.draw(st.integers(min_value=1, max_value=255))
    frame[position] ^= flip
    with pytest.raises(InvalidFrame):
        FrameCiphers(PASSWORD).open(bytes(frame))


@pytest.mark.parametrize("frame", [b"\x02", b"\x02" + b"\x00" * 36, b"\x02garbage" * 10])
def test_aes_gcm_garbage_and_short_frames_are_refused(frame: bytes) -> None:
    with pytest.raises(InvalidFrame):
        FrameCiphers(PASSWORD).open(frame)


def test_another_password_cannot_read_an_aes_gcm_frame() -> None:
    with pytest.raises(InvalidFrame):
        aead("another password").open(aead().seal(b"hello", 1))


def test_a_frame_is_sealed_in_the_newest_format_both_ends_read_and_either_is_read() -> None:
    ciphers = FrameCiphers(PASSWORD)
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
