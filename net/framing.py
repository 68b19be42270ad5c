"""Length-prefixed frames: the byte layer under the codec, sans-IO.

A frame on the wire is a 4-byte unsigned big-endian length ``n`` followed by ``n`` payload
bytes. The payload is opaque here (the transport hands it to the codec).

This module owns:
- `encode_frame`: payload -> frame bytes, for our own outgoing messages.
- `FrameDecoder`: an incremental decoder fed whatever chunks the socket returns.
- `InboundBudget`: the bytes the decoders of one port may buffer together, so many
  connections each holding part of a large frame cannot exhaust memory.

Rules:
- Pure and synchronous: no trio, sockets, clocks or randomness. It must not import the codec
  or the transport.
- Peer bytes are normal input. A declared length above `max_frame_size` raises
  `FrameTooLarge` as soon as the 4-byte header is seen, before any of the payload is
  buffered; a stream that ends inside a frame raises `TruncatedFrame`. Both subclass
  `FrameError`, the only error a peer can provoke here. Our own oversized payload is a local
  bug and raises `ValueError` from `encode_frame`.
- Invariant: `FrameDecoder` buffers at most ``HEADER_SIZE + max_frame_size - 1`` bytes plus
  the last chunk fed to it; a complete frame is always handed out by `next_frame` before
  more input is needed.
- Budget: a decoder given an `InboundBudget` buffers its first `FREE_BYTES` without charge
  (a connection that sends frames of up to 64 KiB, read 64 KiB at a time, is never
  charged) and charges every byte beyond. A `feed` the budget cannot cover poisons the
  decoder with `BudgetExceeded` (a `FrameError`: the caller closes that connection) and
  buffers nothing more. Over all decoders of a budget: ``used <= limit``, and the owner
  calls `release` when a connection ends so its charge returns.
"""

from __future__ import annotations

import struct

HEADER_SIZE = 4
"""Bytes of the length prefix."""

MAX_FRAME_SIZE_LIMIT = 2**32 - 1
"""The largest length a 4-byte prefix can carry."""

DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024
"""16 MiB: room for a large snapshot chunk or log batch, small enough to bound memory."""

_HEADER = struct.Struct(">I")


class FrameError(Exception):
    """The peer sent bytes that do not form a valid frame. The connection must be closed."""


class FrameTooLarge(FrameError):
    """A frame header declared a payload longer than the configured maximum."""

    def __init__(self, length: int, max_frame_size: int) -> None:
        super().__init__(f"frame of {length} bytes exceeds max_frame_size={max_frame_size}")
        self.length = length
        self.max_frame_size = max_frame_size


class TruncatedFrame(FrameError):
    """The stream ended part-way through a frame."""


class BudgetExceeded(FrameError):
    """Buffering this connection's partial frame would exceed its port's `InboundBudget`."""


FREE_BYTES = 128 * 1024
"""Bytes a decoder buffers without charging its budget: a partial frame of up to 64 KiB plus
one 64 KiB receive chunk."""


class InboundBudget:
    """The bytes beyond `FREE_BYTES` that all the frame decoders of one port may buffer at
    once (see the module docstring). Single-threaded (one trio loop); no locking."""

    __slots__ = ("limit", "peak", "refusals", "used")

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"an inbound budget must be >= 0, got {limit}")
        self.limit = limit
        self.used = 0
        """Bytes charged now."""
        self.peak = 0
        """The most ever charged at once."""
        self.refusals = 0
        """Charges refused (each closed a connection)."""

    def take(self, n: int) -> bool:
        """Charge `n` bytes if they fit; whether they did."""
        used = self.used + n
        if used > self.limit:
            self.refusals += 1
            return False
        self.used = used
        if used > self.peak:
            self.peak = used
        return True

    def give(self, n: int) -> None:
        self.used -= n


def _check_max_frame_size(max_frame_size: int) -> None:
    if not 0 < max_frame_size <= MAX_FRAME_SIZE_LIMIT:
        raise ValueError(
            f"max_frame_size must be in [1, {MAX_FRAME_SIZE_LIMIT}], got {max_frame_size}"
        )


def encode_frame(payload: bytes, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> bytes:
    """Prefix `payload` with its length.

    Raises:
        ValueError: the payload is longer than `max_frame_size` (a local bug: the peer would
            refuse the frame and close the connection).
    """
    _check_max_frame_size(max_frame_size)
    if len(payload) > max_frame_size:
        raise ValueError(
            f"payload of {len(payload)} bytes exceeds max_frame_size={max_frame_size}"
        )
    return _HEADER.pack(len(payload)) + payload


class FrameDecoder:
    """Incremental frame decoder.

    Usage::

        decoder.feed(chunk)              # b"" is never fed; call eof() at end of stream
        while (frame := decoder.next_frame()) is not None:
            handle(frame)

    After a `FrameError` the decoder is poisoned: every further call raises the same error
    (the caller closes the connection; there is no resynchronising a byte stream).
    """

    __slots__ = ("_budget", "_buffer", "_charged", "_error", "_max_frame_size")

    def __init__(self, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 budget: InboundBudget | None = None) -> None:
        _check_max_frame_size(max_frame_size)
        self._max_frame_size = max_frame_size
        self._buffer = bytearray()
        self._error: FrameError | None = None
        self._budget = budget
        self._charged = 0

    @property
    def max_frame_size(self) -> int:
        return self._max_frame_size

    @property
    def buffered(self) -> int:
        """Bytes received but not yet handed out as a frame."""
        return len(self._buffer)

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes received from the stream."""
        if self._error is not None:
            raise self._error
        self._buffer += data
        if self._budget is not None and len(self._buffer) > FREE_BYTES + self._charged:
            budget = self._budget
            want = len(self._buffer) - FREE_BYTES
            if not budget.take(want - self._charged):
                self._buffer.clear()
                self.release()
                self._error = BudgetExceeded(
                    f"buffering {want + FREE_BYTES} bytes of a partial frame would exceed the "
                    f"port's inbound budget ({budget.used} of {budget.limit} bytes in use)")
                raise self._error
            self._charged = want

    def release(self) -> None:
        """Return this decoder's charge to its budget (the connection ended). Idempotent;
        a later `feed` charges again."""
        if self._charged and self._budget is not None:
            self._budget.give(self._charged)
            self._charged = 0

    def _recharge(self) -> None:
        budget = self._budget
        want = max(0, len(self._buffer) - FREE_BYTES)
        if budget is not None and want < self._charged:
            budget.give(self._charged - want)
            self._charged = want

    def next_frame(self) -> bytes | None:
        """Return the next complete payload, or None if more bytes are needed.

        Raises:
            FrameTooLarge: the next frame's header declares more than `max_frame_size`.
        """
        if self._error is not None:
            raise self._error
        if len(self._buffer) < HEADER_SIZE:
            return None
        (length,) = _HEADER.unpack_from(self._buffer)
        if length > self._max_frame_size:
            self._error = FrameTooLarge(length, self._max_frame_size)
            self._buffer.clear()
            self.release()
            raise self._error
        end = HEADER_SIZE + length
        if len(self._buffer) < end:
            return None
        payload = bytes(self._buffer[HEADER_SIZE:end])
        del self._buffer[:end]
        if self._charged:
            self._recharge()
        return payload

    def eof(self) -> None:
        """Declare the end of the stream.

        Raises:
            TruncatedFrame: bytes of an incomplete frame are still buffered.
            FrameTooLarge: the buffered header declares an oversized frame.
        """
        if self._error is not None:
            raise self._error
        if len(self._buffer) >= HEADER_SIZE:
            (length,) = _HEADER.unpack_from(self._buffer)
            if length > self._max_frame_size:
                self._error = FrameTooLarge(length, self._max_frame_size)
                raise self._error
            if len(self._buffer) >= HEADER_SIZE + length:
                raise ValueError("eof() called while a complete frame was still pending")
        if self._buffer:
            self._error = TruncatedFrame(
                f"stream ended with {len(self._buffer)} bytes of an incomplete frame"
            )
            raise self._error
