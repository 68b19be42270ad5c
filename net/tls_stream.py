"""A lean TLS stream over a trio socket: `ssl.SSLObject` + memory BIOs, few scheduler trips.

Owns: `TlsStream`, the TLS layer under the peer transport and the client port. It does what
`trio.SSLStream` does for them (handshake, `receive_some`, `send_all`, `getpeercert`,
`aclose`) with a fraction of its Python work per call: no conflict detectors, no inner
locks, no extra checkpoints around each record. In the runtime the Python interpreter, not
the kernel or the crypto, is ~75% of a node's CPU per write (perf, 1 client), and
`trio.SSLStream` was a quarter of the leader's event-loop samples.

Concurrency model (what the transport and the client port need, nothing more): at most one
task receives at a time (a second concurrent receiver is our own misuse:
`trio.BusyResourceError`); senders take turns (one writes the socket at a time, the others
wait). Receiving and sending may overlap. The `SSLObject` calls are synchronous, so they
never interleave; bytes the TLS engine produces while receiving (TLS 1.3 post-handshake
messages) are written by the receiver when no send is in progress, else by the sender
before it returns (the outgoing BIO is FIFO, so records keep their order). `try_send`
writes from the calling task without awaiting, only when no other output is being or
waiting to be written; what the socket does not take waits in a backlog that the next
`send_all` writes first.

Errors: any TLS failure, or the transport ending without a TLS close_notify, raises
`trio.BrokenResourceError` (with the `ssl.SSLError` as its cause) like `trio.SSLStream`;
a clean close_notify makes `receive_some` return ``b""``. Peer bytes are normal input:
nothing here asserts on them.

Must not import: the codec, consensus, storage. No clocks: timeouts are the caller's cancel
scopes (every await here is cancellable).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
from typing import Any

import trio

__all__ = ["TlsStream"]

_RECEIVE_SIZE = 64 * 1024

YIELD_EVERY = 16
"""`receive_some` and `send_all` calls that complete without blocking are not scheduling
points; every this many in a row, one is (`trio.lowlevel.checkpoint`), so a peer that keeps
the socket readable cannot starve the other tasks and cancellation is always delivered."""

_wait_readable = trio.lowlevel.wait_readable
_wait_writable = trio.lowlevel.wait_writable


class TlsStream(trio.abc.Stream):
    """TLS over `transport_stream` (see the module docstring).

    Args:
        transport_stream: a connected `trio.SocketStream` (owned from now on: `aclose`
            closes it).
        context: the `ssl.SSLContext` (certificate checks are the context's).
        server_side: True for the accepting side.
        server_hostname: the name to check the server's certificate against (client side;
            None when the context does not check host names).
    """

    def __init__(
        self,
        transport_stream: trio.SocketStream,
        context: ssl.SSLContext,
        *,
        server_side: bool = False,
        server_hostname: str | None = None,
    ) -> None:
        self.transport_stream = transport_stream
        raw = getattr(transport_stream.socket, "_sock", None)
        self._raw: socket.socket | None = raw if isinstance(raw, socket.socket) else None
        """The stdlib socket under trio's wrapper, for direct non-blocking calls (trio's
        generic wrappers cost more Python than the TLS layer itself); None: go through
        `transport_stream`."""
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(self._in, self._out, server_side=server_side,
                                     server_hostname=server_hostname)
        self._handshaken = False
        self._receiving = False
        self._sending = False
        self._send_idle: trio.Event | None = None
        self._eof = False
        self._unyielded = 0
        self._drained = False
        self._backlog = b""
        """Ciphertext `try_send` accepted but the socket did not take; written first by the
        next `send_all` or flush."""

    # ------------------------------------------------------------------ handshake

    async def do_handshake(self, *, offload: trio.CapacityLimiter | None = None) -> None:
        """Run the TLS handshake (idempotent). Raises `trio.BrokenResourceError` on failure.

        `offload`: run each handshake step that has peer bytes to process (the crypto: a
        key exchange and a signature, a certificate chain to verify; ~0.5-2 ms) in a worker
        thread under this limiter, not on the event loop. OpenSSL releases the GIL
        meanwhile, so the loop keeps serving its other connections: a server takes many
        handshakes at once, and their crypto must not fill its scheduler batches. While the
        step runs no other task may use this stream (a handshake runs before the stream is
        handed to readers and writers)."""
        if self._handshaken:
            return
        while True:
            try:
                if offload is not None and self._in.pending:
                    await trio.to_thread.run_sync(self._ssl.do_handshake, limiter=offload)
                else:
                    self._ssl.do_handshake()
            except ssl.SSLWantReadError:
                await self._flush()
                await self._fill()
                continue
            except ssl.SSLError as exc:
                # Send the alert the engine wrote (the peer learns why), then fail.
                with contextlib.suppress(trio.BrokenResourceError):
                    await self._flush()
                raise trio.BrokenResourceError(f"TLS handshake failed: {exc}") from exc
            await self._flush()
            self._handshaken = True
            return

    def getpeercert(self) -> dict[str, Any] | None:
        """The peer's verified certificate (as `ssl.SSLObject.getpeercert`)."""
        return self._ssl.getpeercert()

    def getpeercert_der(self) -> bytes | None:
        """The peer's verified certificate, DER (`phalanx.net.intercluster`: whose CA)."""
        return self._ssl.getpeercert(binary_form=True)

    # ------------------------------------------------------------------ receiving

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """Application bytes (at most `max_bytes`); ``b""`` after the peer's close_notify."""
        if self._receiving:
            raise trio.BusyResourceError("another task is receiving on this TlsStream")
        self._receiving = True
        try:
            if not self._handshaken:
                await self.do_handshake()
            while True:
                try:
                    data = self._ssl.read(max_bytes or _RECEIVE_SIZE)
                except ssl.SSLWantReadError:
                    if self._out.pending and not self._sending:
                        await self._flush()
                    await self._fill()
                    continue
                except ssl.SSLZeroReturnError:
                    return b""
                except ssl.SSLError as exc:
                    raise trio.BrokenResourceError(f"TLS error: {exc}") from exc
                limit = max_bytes or _RECEIVE_SIZE
                if self._in.pending and len(data) < limit:
                    data = self._read_more(data, limit)
                if self._out.pending and not self._sending:
                    await self._flush()
                await self._maybe_yield()
                return data
        finally:
            self._receiving = False

    def _read_more(self, data: bytes, limit: int) -> bytes:
        """`data` and the plaintext of the further whole records the last socket read
        brought (`ssl.SSLObject.read` returns one record's at a time), up to `limit` bytes:
        what arrived together is handed over together (the transport steps a read's
        messages in one pass). An error or the peer's close_notify stops it; the next
        `receive_some` reports them."""
        parts, size = [data], len(data)
        while self._in.pending and size < limit:
            try:
                more = self._ssl.read(limit - size)
            except ssl.SSLError:  # a partial record, close_notify or a failure: later
                break
            if not more:
                break
            parts.append(more)
            size += len(more)
        return data if len(parts) == 1 else b"".join(parts)

    async def _fill(self) -> None:
        """Read ciphertext from the socket into the engine; EOF without close_notify is
        broken (`ssl.SSLEOFError` from the next read)."""
        if self._eof:
            raise trio.BrokenResourceError("connection closed without a TLS close_notify")
        raw = self._raw
        if raw is None:
            data = await self.transport_stream.receive_some(_RECEIVE_SIZE)
        else:
            if self._drained:
                # The last read emptied the socket: wait before reading instead of paying a
                # failing recv (a syscall and a BlockingIOError) per message.
                self._unyielded = 0
                await _wait_readable(raw)
            while True:
                try:
                    data = raw.recv(_RECEIVE_SIZE)
                    break
                except BlockingIOError:
                    self._unyielded = 0
                    await _wait_readable(raw)
                except OSError as exc:
                    raise trio.BrokenResourceError(f"socket error: {exc}") from exc
            self._drained = len(data) < _RECEIVE_SIZE
        if not data:
            self._eof = True
            self._in.write_eof()
        else:
            self._in.write(data)

    # ------------------------------------------------------------------ sending

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Encrypt `data` and write it all; records follow any pending engine output."""
        if not self._handshaken:
            await self.do_handshake()
        await self._acquire_send()
        try:
            if data:  # b"": only write what `try_send` left behind
                try:
                    self._ssl.write(data)
                except ssl.SSLError as exc:
                    raise trio.BrokenResourceError(f"TLS error: {exc}") from exc
            await self._write_out()
        finally:
            self._release_send()
        await self._maybe_yield()

    def try_send(self, data: bytes) -> bool:
        """Encrypt and write `data` now, without blocking, if no other output is being or
        waiting to be written; False (nothing done) otherwise, or before the handshake.

        True means accepted: the socket took it all, or took part and the rest waits in the
        backlog (`backlogged`) for the caller to trigger a `send_all` (of ``b""`` if need
        be). A socket error also leaves the data in the backlog: the next `send_all`
        reports it. Records keep their order either way.
        """
        raw = self._raw
        if (raw is None or self._sending or self._backlog or self._out.pending
                or not self._handshaken):
            return False
        try:
            self._ssl.write(data)
        except ssl.SSLError:
            return False  # let `send_all` raise it
        out = self._out.read()
        try:
            sent = raw.send(out)
        except OSError:  # BlockingIOError included: all of it waits
            sent = 0
        if sent < len(out):
            self._backlog = out[sent:]
        return True

    @property
    def backlogged(self) -> bool:
        """`try_send` left bytes that a `send_all` must write."""
        return bool(self._backlog)

    async def _flush(self) -> None:
        """Write pending engine output (handshake records, alerts, post-handshake
        messages); waits while another task is sending."""
        await self._acquire_send()
        try:
            await self._write_out()
        finally:
            self._release_send()

    async def _write_out(self) -> None:
        out = self._out
        raw = self._raw
        while self._backlog or out.pending:
            if self._backlog:
                data, self._backlog = self._backlog, b""
            else:
                data = out.read()
            if raw is None:
                await self.transport_stream.send_all(data)
                continue
            view = memoryview(data)
            while view:
                try:
                    sent = raw.send(view)
                except BlockingIOError:
                    self._unyielded = 0
                    await _wait_writable(raw)
                    continue
                except OSError as exc:
                    raise trio.BrokenResourceError(f"socket error: {exc}") from exc
                view = view[sent:]

    async def _maybe_yield(self) -> None:
        self._unyielded += 1
        if self._unyielded >= YIELD_EVERY:
            self._unyielded = 0
            await trio.lowlevel.checkpoint()

    async def _acquire_send(self) -> None:
        while self._sending:
            if self._send_idle is None:
                self._send_idle = trio.Event()
            await self._send_idle.wait()
        self._sending = True

    def _release_send(self) -> None:
        self._sending = False
        if self._send_idle is not None:
            idle, self._send_idle = self._send_idle, None
            idle.set()

    async def wait_send_all_might_not_block(self) -> None:
        await self.transport_stream.wait_send_all_might_not_block()

    # ------------------------------------------------------------------ closing

    async def aclose(self) -> None:
        """Close the socket (no close_notify: peers treat any end of a link alike)."""
        await self.transport_stream.aclose()
