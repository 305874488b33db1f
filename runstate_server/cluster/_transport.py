"""pysyncobj's TCP transport with bounds on what an unauthenticated peer can make a node do.

pysyncobj 0.3.17 buffers a frame until it is complete, whatever length its 4-byte header
announces, before it tries to decrypt it: one connection announcing 2 GiB made the node buffer
everything sent to it, and since it appends each read to an immutable `bytes` (a copy of the whole
buffer per read) and reads until the socket is drained, the tick thread spent seconds copying: no
heartbeats, a new election, 8-10 s of stalled writes. It also keeps a connection that never sends
anything forever, and accepts any number of them. Here (DESIGN.md, "The Raft port"):

- A connection is *unauthenticated* until its handshake is done: pysyncobj's key exchange (the
  peer's first frame must decrypt with the cluster password) and, on an incoming connection, the
  peer naming itself. Until then a frame may announce at most `HANDSHAKE_FRAME_BYTES_MAX`;
  afterwards `PEER_FRAME_BYTES_MAX` (the largest append_entries we send, with room). A frame that
  announces more (or a negative length) closes the connection at once, before its body is read.
- Reading stops as soon as the frame at the front of the buffer is complete (it is parsed, and
  may raise the bound, before the next read; pysyncobj's poll is level-triggered), so an
  unauthenticated connection never holds more than one small frame and one read. The buffer is a
  `bytearray`: appending is not a copy of everything received so far.
- An incoming connection that has not finished its handshake `handshake_timeout_s` after it was
  accepted is closed (checked every tick).
- A frame larger than what the socket takes at once is sent on as soon as the socket is writable
  (pysyncobj left the rest for the next send, a heartbeat later).
- At most `UNAUTHENTICATED_CONNECTIONS_MAX` incoming connections are in their handshake at once,
  and `UNAUTHENTICATED_CONNECTIONS_PER_HOST_MAX` from one remote address; beyond either, an
  accepted connection is closed at once.
- The Raft messages sent and received are counted by type (`messages`: GET /metrics'
  runstate_raft_messages_total).
- Each node tells a peer its command level (`LEVEL`) as soon as their connection is up, and keeps
  the lowest level of its peers (`level_floor`; a peer that is not connected, or that told none,
  counts as level 1: an older release). A leader proposes a command of a higher level only when
  every peer applies it (DESIGN.md, "Command levels"). With it, the newest frame format the node
  reads: a connection's frames are sealed as AES-GCM once its peer told it reads them, as Fernet
  tokens until then (_frame_cipher.py).
- A peer connection on which this node sent nothing for a third of pysyncobj's connection timeout
  gets a keepalive message. pysyncobj closes a connection that read nothing for that timeout, and
  checks it only when the connection has an event or sends: two followers never talk in a steady
  cluster, so when the leader died, the first pre-vote request closed their idle connection
  instead of reaching the other follower, and the election waited for a reconnect and a timeout.

The classes override pysyncobj methods by their name-mangled names (`_TcpConnection__processRead`
...), which is how pysyncobj's own code calls them. Pinned: pysyncobj 0.3.17.
"""

from __future__ import annotations

import collections
import errno
import logging
import socket
import ssl
import struct
import zlib
from typing import Any

from runstate_server.cluster._frame_cipher import FRAMES_AEAD, FRAMES_FERNET, FrameCiphers
from runstate_server.cluster._prevote import PRE_VOTE_REQUEST, PRE_VOTE_RESPONSE
from runstate_server.cluster._pysyncobj import (
    CONNECTION_STATE,
    POLL_EVENT_TYPE,
    TcpConnection,
    TcpServer,
    TCPTransport,
    pysyncobj_pickle,
    raft_clock,
)
from runstate_server.cluster._read_index import READ_INDEX_REQUEST, READ_INDEX_RESPONSE
from runstate_server.cluster.config import (
    HANDSHAKE_FRAME_BYTES_MAX,
    PEER_FRAME_BYTES_MAX,
    UNAUTHENTICATED_CONNECTIONS_MAX,
    UNAUTHENTICATED_CONNECTIONS_PER_HOST_MAX,
)
from runstate_server.cluster.peer_tls import (
    TLS_SNIFF_BYTES,
    PeerTls,
    looks_like_tls,
    names_host,
    peer_identity,
)

logger = logging.getLogger(__name__)

_HEADER = struct.Struct("i")  # pysyncobj's frame header: the body's length, native int
# A frame body (pickled message) up to this size is stored in its zlib stream, not deflated:
# deflating a heartbeat or an answer of a few dozen bytes cost more (~5 µs) than it saved. The
# receiver inflates either alike (pysyncobj's own code included).
FRAME_DEFLATE_BYTES_MIN = 512
FRAME_DEFLATE_LEVEL = 3  # pysyncobj's level for the rest
_FRAME_STORE_LEVEL = 0
# The zlib stream's window is the smallest that reaches back over the whole body (zlib's 512 bytes
# to its 32 KiB default; zlib keeps ZLIB_LOOKAHEAD_BYTES of a window for what is ahead), and a
# stored body's compressor gets the least memory: zlib.compress's defaults make it set up a 32 KiB
# window and a 64 Ki-entry hash table for every frame, which cost ~30 µs per frame on the test
# machine, a heartbeat's or an answer's included (stored: ~1 µs; a 600-byte append deflated ~9 µs
# against ~41). The window size is in the stream's header, so any zlib reader (pysyncobj's
# `zlib.decompress`, at its default window, included) inflates the body as before; the deflated
# bytes are the same.
_WINDOW_BITS_MIN = 9
ZLIB_LOOKAHEAD_BYTES = 262  # zlib's MIN_LOOKAHEAD: a match reaches back at most the window less this
_WINDOW_BITS_MAX = zlib.MAX_WBITS
_STORE_MEMORY_LEVEL = 1
_DEFLATE_MEMORY_LEVEL = zlib.DEF_MEM_LEVEL

# The Raft messages a node sends and receives, counted by type (pysyncobj's, then ours); any other
# is counted as "other". A fixed set: the counters' keys never change once made, so the loop may
# copy them while the tick thread counts.
KEEPALIVE = "runstate_keepalive"  # read and dropped (RaftNode); pysyncobj ignores types it does not know
# {"level": int, "frames": int}: the commands the sender applies and the newest frame format it reads
# (_frame_cipher.py; releases before formats tell none). Read here, never passed on.
LEVEL = "runstate_level"
MESSAGE_TYPES = (
    "append_entries", "next_node_idx", "request_vote", "response_vote", "apply_command", "apply_command_response",
    PRE_VOTE_REQUEST, PRE_VOTE_RESPONSE, READ_INDEX_REQUEST, READ_INDEX_RESPONSE, KEEPALIVE, LEVEL, "other",
)
# The level of a peer that is not connected or told none (a release from before levels were told).
LEVEL_UNTOLD = 1
# The epoch of a cluster never forced into a new one, and of a peer of a release that tells none.
EPOCH_UNTOLD = 1
EPOCH_REFUSALS_LOGGED_EVERY = 100
# A peer connection idle in sending for this share of the connection timeout gets a keepalive.
KEEPALIVE_SHARE_OF_TIMEOUT = 1 / 3

# A connection's TLS (peer_tls.py), BoundedConnection.tls_state: none on it (a cluster without peer
# certificates, or a password-sealed connection with --peer-tls-allow-plain); an incoming one whose
# first bytes are not read yet (allow_plain: TLS or not?); TLS to begin as soon as the TCP connection
# is up (dialling) or the first event comes (accepting); its handshake under way; done.
TLS_NONE, TLS_SNIFFING, TLS_TO_START, TLS_HANDSHAKING, TLS_UP = "none", "sniffing", "to-start", "handshaking", "up"
_TLS_BEFORE_FRAMES = frozenset({TLS_SNIFFING, TLS_TO_START, TLS_HANDSHAKING})
# Reads of data TLS already decrypted and holds (the poller cannot see it) after one event, at most:
# each reads up to one socket read's worth, and TLS holds at most one record (16 KiB) decrypted.
TLS_PENDING_READS_MAX = 64
# OpenSSL's reasons for a handshake with a peer that sent something other than TLS.
_NOT_TLS_REASONS = frozenset({"WRONG_VERSION_NUMBER", "HTTP_REQUEST", "RECORD_LAYER_FAILURE"})
# ... and for one whose connection closed mid-handshake: a peer going away (a partition, a restart,
# its handshake deadline), or, dialling a release without TLS, its refusal of the TLS record as a
# frame too long. Not a refusal by this node: logged at DEBUG, not counted.
_CLOSED_REASONS = frozenset({"UNEXPECTED_EOF_WHILE_READING"})


def _frame_body(pickled: bytes) -> bytes:
    window_bits = min(_WINDOW_BITS_MAX, max(_WINDOW_BITS_MIN, (len(pickled) + ZLIB_LOOKAHEAD_BYTES).bit_length()))
    if len(pickled) >= FRAME_DEFLATE_BYTES_MIN:
        compressor = zlib.compressobj(FRAME_DEFLATE_LEVEL, zlib.DEFLATED, window_bits, _DEFLATE_MEMORY_LEVEL)
    else:
        compressor = zlib.compressobj(_FRAME_STORE_LEVEL, zlib.DEFLATED, window_bits, _STORE_MEMORY_LEVEL)
    return compressor.compress(pickled) + compressor.flush()


class BoundedConnection(TcpConnection):  # type: ignore[misc]
    """A TcpConnection that refuses frames longer than its current bound and buffers linearly."""

    # pysyncobj's attributes this class reads and sets (declared for mypy only).
    _TcpConnection__readBuffer: bytes | bytearray
    _TcpConnection__writeBuffer: bytes
    _TcpConnection__socket: Any
    recvLastTimestamp: int

    def __init__(self, *args: Any, remote_host: str | None = None, **kwargs: Any) -> None:
        self.frame_bytes_max = HANDSHAKE_FRAME_BYTES_MAX
        self.remote_host = remote_host
        self.handshake_deadline = float("inf")  # set by the transport on incoming connections
        self.frames_refused = 0
        self.peer = False  # the handshake is done (authenticated)
        self.last_sent_at = float("-inf")  # pysyncobj's clock
        self.peer_formats = FRAMES_FERNET  # the frame formats the peer told it reads (LEVEL)
        # The node's frame ciphers (its transport's), set before the connection sends or reads a
        # frame; used only where pysyncobj set `encryptor` (a cluster with a password).
        self.ciphers: FrameCiphers | None = None
        # TLS on this connection (peer_tls.py; set by the transport before the first event).
        self.peer_tls: PeerTls | None = None
        self.tls_state = TLS_NONE
        self.tls_host: str | None = None  # the host dialled (its certificate must name it); None: accepted
        self.password_encryptor: Any = None  # pysyncobj's encryptor, for a connection without TLS
        self.plain_next = False  # allow_plain: dial the next time without TLS (the last TLS handshake failed)
        self.dial_name: str | None = None  # the name the peer's certificate must carry when dialled (its host)
        self.handshake_timeout_s = float("inf")  # a dialled TLS handshake's bound (set by the transport)
        self.on_tls_refused: Any = None  # the transport's counter of refused TLS handshakes
        self._in_event = False  # pysyncobj's handling of one of its socket's events is under way
        super().__init__(*args, **kwargs)

    def send(self, message: Any) -> None:
        # pysyncobj's send (its frame, byte for byte in format), with the frame encrypted by
        # FrameCipher and a small frame stored rather than deflated (_frame_body).
        self.last_sent_at = raft_clock()
        if self.sendRandKey:
            message = (self.sendRandKey, message)
        data = _frame_body(pysyncobj_pickle.dumps(message))
        if self.encryptor:
            assert self.ciphers is not None, "the transport gives each connection its ciphers"
            data = self.ciphers.seal(data, int(raft_clock()), formats=self.peer_formats)
        self._TcpConnection__writeBuffer += _HEADER.pack(len(data)) + data
        self._TcpConnection__trySendBuffer()
        # pysyncobj sends what the socket takes and keeps the rest, but asks the poller to say when
        # the socket is writable again only from its own event handler, which unsubscribes once a
        # write event found the buffer empty: the rest of a frame larger than the socket's buffer
        # (an append_entries of big batches) waited for the next send, a heartbeat up to
        # append_entries_period_s later, once per socket buffer. Ask for the write event now.
        fileno = self._TcpConnection__fileno
        if self._TcpConnection__writeBuffer and fileno is not None and self.state == CONNECTION_STATE.CONNECTED:
            self._TcpConnection__poller.subscribe(
                fileno, self._TcpConnection__processConnection,
                POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE | POLL_EVENT_TYPE.ERROR,
            )

    def authenticated(self) -> None:
        """The handshake is done: the peer knows the cluster password and named itself."""
        self.frame_bytes_max = PEER_FRAME_BYTES_MAX
        self.handshake_deadline = float("inf")
        self.peer = True

    def connect(self, host: str, port: int) -> bool:
        if self._in_event and self.peer_tls is not None:
            # pysyncobj's __processConnection found the connection timed out, closed it, and the
            # transport dials again at once, from inside that event: pysyncobj then goes on with the
            # event as the new socket's and calls onConnected while it is still connecting, before
            # TLS (its first frame went out in plain). Dialled on the next round instead
            # (connection_retry_s later).
            return False
        # An outgoing connection object is reused for every reconnection: a new handshake each time,
        # and Fernet tokens until the peer tells again which formats it reads (it may be another release now).
        self.frame_bytes_max = HANDSHAKE_FRAME_BYTES_MAX
        self.peer_formats = FRAMES_FERNET
        self.peer = False
        tls = self.peer_tls is not None and not (self.peer_tls.allow_plain and self.plain_next)
        self.plain_next = False
        self.tls_state = TLS_TO_START if tls else TLS_NONE
        self.tls_host = self.dial_name or host
        self.encryptor = None if tls else self.password_encryptor  # TLS seals the frames itself
        self.handshake_deadline = raft_clock() + self.handshake_timeout_s if tls else float("inf")
        return bool(super().connect(host, port))

    def accepted(self, peer_tls: PeerTls | None, deadline: float) -> None:
        """An incoming connection, before its first event: TLS or not is decided on it."""
        self.peer_tls = peer_tls
        self.handshake_deadline = deadline
        self.password_encryptor = self.encryptor
        if peer_tls is None:
            return
        self.tls_state = TLS_SNIFFING if peer_tls.allow_plain else TLS_TO_START
        self.encryptor = None

    @property
    def tls(self) -> bool:
        """The connection's frames go over TLS (once its handshake is done)."""
        return self.tls_state != TLS_NONE

    # pysyncobj's __processConnection: the poller's callback for every event of the socket. Before
    # TLS is up, the events drive its handshake; afterwards pysyncobj's code runs, and then reads
    # what TLS decrypted and holds, which the poller cannot see.
    def _TcpConnection__processConnection(self, descr: int, event: int) -> None:
        if self.tls_state in _TLS_BEFORE_FRAMES:
            self._tls_event(descr, event)
            return
        self._pysyncobj_event(descr, event)
        if self.tls_state != TLS_UP:
            return
        sock = self._TcpConnection__socket
        for _ in range(TLS_PENDING_READS_MAX):
            if self.state == CONNECTION_STATE.DISCONNECTED or sock is None or not sock.pending():
                return
            self._pysyncobj_event(descr, POLL_EVENT_TYPE.READ)

    def _pysyncobj_event(self, descr: int, event: int) -> None:
        self._in_event = True
        try:
            super()._TcpConnection__processConnection(descr, event)
        finally:
            self._in_event = False

    def _tls_event(self, descr: int, event: int) -> None:
        poller = self._TcpConnection__poller
        if descr != self._TcpConnection__fileno:
            poller.unsubscribe(descr)
            return
        sock = self._TcpConnection__socket
        if event & POLL_EVENT_TYPE.ERROR or sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            self._tls_closed("the connection failed")  # e.g. the peer is down: not a refusal, nothing to log
            return
        if self.tls_state == TLS_SNIFFING:
            try:
                prefix = sock.recv(TLS_SNIFF_BYTES, socket.MSG_PEEK)
            except (BlockingIOError, InterruptedError):  # a write event: wait for the peer's first bytes
                poller.subscribe(descr, self._TcpConnection__processConnection, POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR)
                return
            except OSError:
                self.disconnect()
                return
            if not prefix:
                self.disconnect()
                return
            if len(prefix) < TLS_SNIFF_BYTES:
                poller.subscribe(descr, self._TcpConnection__processConnection, POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR)
                return
            if not looks_like_tls(prefix):  # a peer without a certificate yet: the password's frames
                self.tls_state = TLS_NONE
                self.encryptor = self.password_encryptor
                self._pysyncobj_event(descr, event)
                return
            self.tls_state = TLS_TO_START
        if self.tls_state == TLS_TO_START:
            assert self.peer_tls is not None
            try:
                sock = self.peer_tls.wrap(sock, server_hostname=self.tls_host)
            except (OSError, ValueError) as error:
                self._tls_failed(str(error), certificate=False)
                return
            self._TcpConnection__socket = sock
            self.tls_state = TLS_HANDSHAKING
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            poller.subscribe(descr, self._TcpConnection__processConnection, POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR)
            return
        except ssl.SSLWantWriteError:
            poller.subscribe(
                descr, self._TcpConnection__processConnection,
                POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE | POLL_EVENT_TYPE.ERROR,
            )
            return
        except ssl.SSLCertVerificationError as error:
            self._tls_failed(f"its certificate does not verify against --peer-tls-ca: {error.verify_message or error}",
                             certificate=True)
            return
        except (OSError, ValueError) as error:
            reason = error.reason if isinstance(error, ssl.SSLError) and error.reason else str(error) or type(error).__name__
            if isinstance(error, (ssl.SSLEOFError, ConnectionError)) or reason in _CLOSED_REASONS:
                self._tls_closed(reason)
                return
            if reason in _NOT_TLS_REASONS:
                reason = f"it does not speak TLS ({reason})"
            # An alert about a certificate: the peer refused this node's, or sent none.
            self._tls_failed(reason, certificate=isinstance(error, ssl.SSLError) and "CERTIFICATE" in reason.upper())
            return
        self.tls_state = TLS_UP
        self._TcpConnection__lastReadTime = raft_clock()
        poller.subscribe(
            descr, self._TcpConnection__processConnection,
            POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE | POLL_EVENT_TYPE.ERROR,
        )
        if self.tls_host is not None:
            # Dialled, and the peer's certificate verified and names the host: pysyncobj now sees
            # the connection up (its onConnected: the key exchange or the node's address).
            self.authenticated()
            self.handshake_deadline = float("inf")
            self._pysyncobj_event(descr, POLL_EVENT_TYPE.WRITE)
        elif sock.pending():
            self._TcpConnection__processConnection(descr, POLL_EVENT_TYPE.READ)

    def _tls_closed(self, reason: str) -> None:
        if self.tls_host is not None and self.peer_tls is not None and self.peer_tls.allow_plain and self.tls_state == TLS_HANDSHAKING:
            self.plain_next = True  # perhaps a peer without certificates yet: the password next time
        logger.debug("Raft port: a TLS handshake with %s ended: the connection closed (%s)",
                     self.tls_host or self.remote_host or "a peer", reason)
        self.disconnect()

    def _tls_failed(self, reason: str, *, certificate: bool) -> None:
        if self.on_tls_refused is not None:
            self.on_tls_refused()
        if self.tls_host is not None and not certificate and self.peer_tls is not None and self.peer_tls.allow_plain:
            self.plain_next = True  # perhaps a peer without certificates yet: the password next time
        logger.warning(
            "Raft port: %s %s refused: %s",
            "TLS with the peer at" if self.tls_host is not None else "a TLS connection from",
            self.tls_host or self.remote_host or "a peer", reason,
        )
        self.disconnect()

    def tls_identity_names(self, host: str) -> bool:
        """Whether this (accepted, TLS) connection's peer certificate names `host`."""
        sock = self._TcpConnection__socket
        return isinstance(sock, ssl.SSLSocket) and names_host(peer_identity(sock), host)

    def tls_identity_is_server(self) -> bool:
        """Whether this (accepted, TLS) connection's peer certificate is one for servers (a node's)."""
        sock = self._TcpConnection__socket
        return isinstance(sock, ssl.SSLSocket) and peer_identity(sock).server

    # pysyncobj's __processSend, for a TLS socket: a write TLS cannot finish now (the socket is full)
    # is tried again, with the same bytes first, on the next send or write event.
    def _TcpConnection__processSend(self) -> bool:
        if self.tls_state in _TLS_BEFORE_FRAMES:
            return False  # nothing of a TLS connection goes out before TLS is up
        if self.tls_state != TLS_UP:
            return bool(super()._TcpConnection__processSend())
        buffer = self._TcpConnection__writeBuffer
        if not buffer:
            return False
        try:
            sent = self._TcpConnection__socket.send(buffer)
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError, InterruptedError):
            return False
        except OSError:
            self.disconnect()
            return False
        if sent <= 0:
            return False
        self._TcpConnection__writeBuffer = buffer[sent:]
        return True

    def _buffer(self) -> bytearray:
        buffer = self._TcpConnection__readBuffer
        if not isinstance(buffer, bytearray):  # pysyncobj resets it to bytes() on (dis)connect
            buffer = bytearray(buffer)
            self._TcpConnection__readBuffer = buffer
        return buffer

    def _front_frame_ready(self, buffer: bytearray) -> bool:
        """True once the frame at the front is complete, or refused (then the connection is closed)."""
        if len(buffer) < _HEADER.size:
            return False
        (length,) = _HEADER.unpack_from(buffer)
        if length < 0 or length > self.frame_bytes_max:
            self.frames_refused += 1
            logger.warning(
                "Raft port: closing a connection from %s announcing a %d-byte frame (at most %d %s)",
                self.remote_host or "a peer", length, self.frame_bytes_max,
                "before the handshake" if self.frame_bytes_max == HANDSHAKE_FRAME_BYTES_MAX else "from a peer",
            )
            self.disconnect()
            return True
        return len(buffer) >= _HEADER.size + length

    # pysyncobj's __processRead: one recv; False stops the read loop (drained, closed, or a frame
    # to parse first).
    def _TcpConnection__processRead(self) -> bool:
        sock = self._TcpConnection__socket
        try:
            incoming = sock.recv(self._TcpConnection__recvBufferSize)
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return False  # TLS needs more of the peer's bytes (or to send first) before it has more
        except OSError as error:
            if error.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                self.disconnect()
            return False
        if not incoming or sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            self.disconnect()
            return False
        buffer = self._buffer()
        buffer += incoming
        return not self._front_frame_ready(buffer)

    # pysyncobj's __processParseMessage, on the bytearray and with the bound checked again.
    def _TcpConnection__processParseMessage(self) -> Any:
        buffer = self._buffer()
        if not self._front_frame_ready(buffer) or self.state == CONNECTION_STATE.DISCONNECTED:
            return None
        (length,) = _HEADER.unpack_from(buffer)
        data = bytes(buffer[_HEADER.size:_HEADER.size + length])
        try:
            if self.encryptor:
                assert self.ciphers is not None, "the transport gives each connection its ciphers"
                timestamp, data = self.ciphers.open(data)
                if timestamp < self.recvLastTimestamp:
                    raise ValueError("a frame older than the previous one")
                self.recvLastTimestamp = timestamp
            message = pysyncobj_pickle.loads(zlib.decompress(data))
            if self.recvRandKey:
                rand_key, message = message
                if rand_key != self.recvRandKey:
                    raise ValueError("wrong connection key")
        except Exception:
            # pysyncobj drops such a connection silently too (a wrong password, garbage).
            self.disconnect()
            return None
        del buffer[:_HEADER.size + length]
        return message


class BoundedServer(TcpServer):  # type: ignore[misc]
    """pysyncobj's TcpServer, accepting only what the transport admits, as BoundedConnections."""

    def __init__(self, *args: Any, admit: Any, **kwargs: Any) -> None:
        self._admit = admit
        super().__init__(*args, **kwargs)

    def _TcpServer__onNewConnection(self, descr: int, event: int) -> None:
        if event & POLL_EVENT_TYPE.READ:
            try:
                sock, address = self._TcpServer__socket.accept()
            except OSError as error:
                if error.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                    self.unbind()
                return
            host = str(address[0])
            if not self._admit(host):
                sock.close()
                return
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._TcpServer__sendBufferSize)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._TcpServer__recvBufferSize)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setblocking(False)
                conn = BoundedConnection(
                    poller=self._TcpServer__poller,
                    socket=sock,
                    timeout=self._TcpServer__connectionTimeout,
                    sendBufferSize=self._TcpServer__sendBufferSize,
                    recvBufferSize=self._TcpServer__recvBufferSize,
                    keepalive=self._TcpServer__keepalive,
                    remote_host=host,
                )
            except OSError:  # the peer is already gone
                sock.close()
                return
            self._TcpServer__onNewConnectionCallback(conn)
        if event & POLL_EVENT_TYPE.ERROR:
            self.unbind()


class BoundedTransport(TCPTransport):  # type: ignore[misc]
    """TCPTransport with BoundedServer/BoundedConnection, a handshake deadline and connection caps.
    Runs in the tick thread only, like pysyncobj's."""

    def __init__(
        self, syncObj: Any, selfNode: Any, otherNodes: Any, *, handshake_timeout_s: float, command_level: int,
        epoch: int = EPOCH_UNTOLD, peer_tls: PeerTls | None = None,
    ) -> None:
        assert handshake_timeout_s > 0 and command_level >= LEVEL_UNTOLD
        self.handshake_timeout_s = handshake_timeout_s
        self.peer_tls = peer_tls  # mutual TLS on the port (peer_tls.py); None: the password's frames only
        self.tls_refused = 0  # TLS handshakes that failed, and verified peers whose certificate named another host
        self.connections_refused = 0
        self.utility_messages_refused = 0  # pysyncobj admin commands sent to the Raft port
        self.handshakes_timed_out = 0
        self.messages: dict[tuple[str, str], int] = {
            (direction, kind): 0 for direction in ("sent", "received") for kind in MESSAGE_TYPES
        }
        self.command_level = command_level
        # The cluster's epoch (DESIGN.md "Membership"): a peer that tells another one is of another
        # cluster (a forced recovery's, or the one it left): its connection is closed.
        self.epoch = epoch
        self.epochs_refused = 0
        self._of_another_epoch: set[Any] = set()  # peers that told another epoch: nothing of theirs is read
        self._peer_levels: dict[Any, int] = {}  # connected peers that told their level
        # The lowest command level of this node and its peers: one int, replaced whole (other
        # threads read it).
        self.level_floor = LEVEL_UNTOLD if otherNodes else command_level
        self.peers_told = 0  # how many of them: one int, replaced whole
        self.levels_told: dict[str, int] = {}
        # The Raft frames' ciphers, under the cluster password (None without one). Made before
        # pysyncobj's constructor makes the outgoing connections (addNode), which take them.
        password = syncObj.conf.password
        self.frame_ciphers = FrameCiphers(password) if password is not None else None
        if self.frame_ciphers is not None and syncObj.encryptor:
            self.frame_ciphers.check_against(syncObj.encryptor, int(raft_clock()))
        super().__init__(syncObj, selfNode, otherNodes)

    def send(self, node: Any, message: Any) -> bool:
        self._count("sent", message)
        return bool(super().send(node, message))

    def _onMessageReceived(self, node: Any, message: Any) -> None:
        self._count("received", message)
        if isinstance(message, dict) and message.get("type") == LEVEL:
            epoch = message.get("epoch", EPOCH_UNTOLD)
            if epoch != self.epoch:
                self._refuse_epoch(node, epoch)
                return
            self._of_another_epoch.discard(node)
            level = message.get("level")
            if type(level) is int and level >= LEVEL_UNTOLD and node in self._nodes:
                self._peer_levels[node] = level
                self._update_level_floor()
            formats = message.get("frames")
            conn = self._connections.get(node)
            if type(formats) is int and formats >= FRAMES_AEAD and isinstance(conn, BoundedConnection):
                conn.peer_formats = formats  # from now on it gets the newest format both read
            return
        if node in self._of_another_epoch:
            return  # sent by a node of another epoch after its level: never read (its connection is closing)
        super()._onMessageReceived(node, message)

    def _onNodeConnected(self, node: Any) -> None:
        super()._onNodeConnected(node)
        formats = self.frame_ciphers.formats if self.frame_ciphers is not None else FRAMES_FERNET
        self.send(node, {"type": LEVEL, "level": self.command_level, "frames": formats, "epoch": self.epoch})

    def _onNodeDisconnected(self, node: Any) -> None:
        if self._peer_levels.pop(node, None) is not None:
            self._update_level_floor()
        super()._onNodeDisconnected(node)

    def _refuse_epoch(self, node: Any, epoch: Any) -> None:
        self._of_another_epoch.add(node)
        self.epochs_refused += 1
        if self.epochs_refused == 1 or self.epochs_refused % EPOCH_REFUSALS_LOGGED_EVERY == 0:
            logger.warning(
                "Raft port: %s told cluster epoch %r, this node's is %d: a node of another cluster (before a forced "
                "recovery, or one it left) is refused (%d refusals so far)", node, epoch, self.epoch, self.epochs_refused,
            )
        conn = self._connections.get(node)
        if conn is not None:
            conn.disconnect()

    def _update_level_floor(self) -> None:
        levels = [self._peer_levels.get(node, LEVEL_UNTOLD) for node in self._nodes]
        self.level_floor = min([self.command_level, *levels])
        self.peers_told = len(self._peer_levels)
        # By peer address, the level each connected peer told: one dict, replaced whole.
        self.levels_told = {str(node.id): level for node, level in self._peer_levels.items()}

    def _count(self, direction: str, message: Any) -> None:
        kind = message.get("type") if isinstance(message, dict) else None
        key = (direction, kind if kind in MESSAGE_TYPES else "other")
        self.messages[key] += 1

    def _createServer(self) -> None:
        conf = self._syncObj.conf
        assert conf.bindAddress is not None, "LogConfig always gives pysyncobj a bind address"
        host, port = conf.bindAddress.rsplit(":", 1)
        self._server = BoundedServer(
            self._syncObj._poller, host, port,
            onNewConnection=self._onNewIncomingConnection,
            sendBufferSize=conf.sendBufferSize,
            recvBufferSize=conf.recvBufferSize,
            connectionTimeout=conf.connectionTimeout,
            admit=self._admit,
        )

    def _admit(self, host: str) -> bool:
        pending = self._unknownConnections
        from_host = sum(1 for conn in pending if getattr(conn, "remote_host", None) == host)
        if len(pending) < UNAUTHENTICATED_CONNECTIONS_MAX and from_host < UNAUTHENTICATED_CONNECTIONS_PER_HOST_MAX:
            return True
        self.connections_refused += 1
        logger.warning(
            "Raft port: refusing a connection from %s (%d in their handshake, %d from it)", host, len(pending), from_host
        )
        return False

    def addNode(self, node: Any) -> None:
        super().addNode(node)
        conn = self._connections.get(node)
        if conn is None or isinstance(conn, BoundedConnection):
            return
        # pysyncobj made a plain TcpConnection for the outgoing side (not connected yet): replace it.
        conf = self._syncObj.conf
        bounded = BoundedConnection(
            poller=self._syncObj._poller,
            timeout=conf.connectionTimeout,
            sendBufferSize=conf.sendBufferSize,
            recvBufferSize=conf.recvBufferSize,
            keepalive=conf.tcp_keepalive,
            remote_host=getattr(node, "host", None),
        )
        bounded.encryptor = bounded.password_encryptor = self._syncObj.encryptor
        bounded.ciphers = self.frame_ciphers
        bounded.peer_tls = self.peer_tls
        bounded.dial_name = getattr(node, "host", None)
        bounded.handshake_timeout_s = self.handshake_timeout_s
        bounded.on_tls_refused = self._count_tls_refused
        bounded.setOnConnectedCallback(lambda: self._onOutgoingConnected(bounded))
        bounded.setOnMessageReceivedCallback(lambda message: self._onMessageReceived(node, message))
        bounded.setOnDisconnectedCallback(lambda: self._onDisconnected(bounded))
        self._connections[node] = bounded

    def _onNewIncomingConnection(self, conn: BoundedConnection) -> None:
        conn.ciphers = self.frame_ciphers
        conn.on_tls_refused = self._count_tls_refused
        super()._onNewIncomingConnection(conn)  # sets its encryptor (the password's)
        conn.accepted(self.peer_tls, raft_clock() + self.handshake_timeout_s)

    def _count_tls_refused(self) -> None:
        self.tls_refused += 1

    def _names_itself_truly(self, conn: BoundedConnection, message: Any) -> bool:
        """Over TLS, a peer naming itself (its Raft address, or "readonly": a learner) must hold a
        certificate for it: one that names that address's host, or, for a learner, a server's."""
        if message == "readonly":
            if conn.tls_identity_is_server():
                return True
            reason = "a learner's certificate must be a node's (for servers), not a client's"
        else:
            node = self._nodeAddrToNode.get(message) if isinstance(message, str) else None
            if node is None or conn.tls_identity_names(node.host):
                return True  # an unknown name is refused by pysyncobj as before
            reason = f"its certificate does not name {node.host}, the host of the Raft address {message} it gave"
        self.tls_refused += 1
        logger.warning("Raft port: refusing a TLS connection from %s: %s", conn.remote_host or "a peer", reason)
        conn.disconnect()
        self._unknownConnections.discard(conn)
        return False

    def _onIncomingMessageReceived(self, conn: BoundedConnection, message: Any) -> None:
        if isinstance(message, list) and conn.sendRandKey:
            # pysyncobj's admin commands (syncobj_admin: add, remove, transfer, set_version, status)
            # arrive as a list instead of a node's address: they would change the configuration past
            # every check of ours (the operator routes, the command level, the quorum). Refused.
            self.utility_messages_refused += 1
            conn.disconnect()
            self._unknownConnections.discard(conn)
            return
        naming = bool(conn.sendRandKey) or not self._syncObj.encryptor  # the key exchange is done
        if conn.tls and naming and not isinstance(message, list) and not self._names_itself_truly(conn, message):
            return
        super()._onIncomingMessageReceived(conn, message)
        if conn not in self._unknownConnections and conn.state == CONNECTION_STATE.CONNECTED:
            conn.authenticated()  # it named a node of the cluster (after the key exchange)

    def _onOutgoingMessageReceived(self, conn: BoundedConnection, message: Any) -> None:
        super()._onOutgoingMessageReceived(conn, message)
        if conn.state == CONNECTION_STATE.CONNECTED:
            conn.authenticated()  # its first frame decrypted: the peer knows the password

    def _onTick(self) -> None:
        super()._onTick()
        now = raft_clock()
        expired = [conn for conn in self._unknownConnections if conn.handshake_deadline < now]
        for conn in expired:
            self.handshakes_timed_out += 1
            conn.disconnect()  # calls _onDisconnected, which forgets it
            self._unknownConnections.discard(conn)
        for conn in list(self._connections.values()):  # a dialled TLS handshake that does not end
            if (
                isinstance(conn, BoundedConnection) and conn.tls_state in _TLS_BEFORE_FRAMES and conn.handshake_deadline < now
                and conn.state != CONNECTION_STATE.DISCONNECTED
            ):
                self.handshakes_timed_out += 1
                conn.disconnect()
        self._keep_alive(now)

    def _keep_alive(self, now: float) -> None:
        """A keepalive on each peer connection this node sent nothing on for a while, so that the
        peer reads something well within pysyncobj's connection timeout (module docstring)."""
        idle_since = now - self._syncObj.conf.connectionTimeout * KEEPALIVE_SHARE_OF_TIMEOUT
        for node, conn in list(self._connections.items()):
            if (
                isinstance(conn, BoundedConnection) and conn.peer and conn.last_sent_at < idle_since
                and conn.state == CONNECTION_STATE.CONNECTED
            ):
                self.send(node, {"type": KEEPALIVE})

    def counts(self) -> dict[str, int]:
        pending = list(self._unknownConnections)  # one C-level copy: the tick thread changes the set
        hosts = collections.Counter(getattr(conn, "remote_host", None) for conn in pending)
        return {
            "handshaking": len(pending),
            "handshaking_hosts": len(hosts),
            "refused": self.connections_refused,
            "handshakes_timed_out": self.handshakes_timed_out,
            "tls_refused": self.tls_refused,
        }
