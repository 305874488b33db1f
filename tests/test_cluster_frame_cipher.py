"""The Raft port's frame cipher makes and reads the same tokens as cryptography's Fernet, which
pysyncobj uses on nodes without it; the transport's frames still read with pysyncobj's own code."""

from __future__ import annotations

import zlib

import pytest
from cryptography.fernet import Fernet, InvalidToken
from hypothesis import given
from hypothesis import strategies as st
from pysyncobj.encryptor import getEncryptor

from runstate_server.cluster._frame_cipher import FrameCipher, InvalidFrame, frame_cipher
from runstate_server.cluster._transport import FRAME_DEFLATE_BYTES_MIN, ZLIB_LOOKAHEAD_BYTES, _frame_body

FERNET = getEncryptor("the cluster password")
OTHER = getEncryptor("another password")
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
    cipher = frame_cipher(renamed)
    assert not isinstance(cipher, FrameCipher)
    assert cipher.open(renamed.encrypt_at_time(b"data", 9)) == (9, b"data")
    assert renamed.decrypt(cipher.seal(b"more", 10)) == b"more"
    with pytest.raises(InvalidFrame):
        cipher.open(FERNET.encrypt(b"x"))


def test_one_cipher_per_encryptor() -> None:
    assert frame_cipher(FERNET) is frame_cipher(FERNET)
    assert frame_cipher(FERNET) is not frame_cipher(OTHER)


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
