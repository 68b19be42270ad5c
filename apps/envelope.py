"""The replica checkpoint envelope: applied index, session table, then the application's state.

Owns: the on-disk (and on-wire, for state transfer) format of a replica checkpoint, its
bounded-step serialiser and its strict parser; and the format of the small metadata record
stored beside each checkpoint (`SnapshotMeta`, as a codec frame).

Must not import: consensus cores, storage backends, trio, clocks.

Format (version 1), concatenated:
    msgpack ["phalanx.replica", 1, applied_index, session_count]
    msgpack [client_id, request_no, result, client_id, ...]   # <= CHUNK_SESSIONS sessions
    ... repeated until session_count sessions, client ids strictly ascending
    the application's checkpoint bytes (the rest of the data; see its own format)

Invariants:
- Deterministic: equal (index, sessions, app state) give equal bytes in every process.
- Checkpoint bytes come from disk or from peers: parsing raises `SnapshotFormatError` on
  any malformed input, never anything else, and never asserts.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import immutables
import msgpack  # type: ignore[import-untyped]  # no stubs shipped

from phalanx.apps.interface import SnapshotFormatError, StateSnapshot
from phalanx.apps.sorted_steps import sorted_in_steps
from phalanx.consensus.types import SnapshotMeta, raw_init
from phalanx.net import wire
from phalanx.net.codec import DecodeError

CHUNK_SESSIONS = 2048
"""Sessions per checkpoint array (part of the format)."""
SORT_RUN = 2048
STEP_SESSIONS = 256
"""Sessions handled per serialisation step (bounds the work of one step)."""
_MAGIC = "phalanx.replica"
_VERSION = 1


@raw_init  # built once per applied write
@dataclass(frozen=True, slots=True, kw_only=True)
class Session:
    """A client's deduplication record: its latest applied request and the cached reply
    (Raft dissertation §6.3)."""

    request_no: int
    result: bytes


Sessions = immutables.Map[str, Session]


def envelope_chunks(
    *, index: int, sessions: Sessions, app: StateSnapshot
) -> Iterator[bytes]:
    """Serialise a checkpoint in bounded steps (each `next()` does bounded work; steps with no
    output yet yield `b""`)."""
    yield msgpack.packb([_MAGIC, _VERSION, index, len(sessions)])
    flat: list[object] = []
    for ids in sorted_in_steps(sessions.keys(), run=SORT_RUN, step=STEP_SESSIONS):
        if ids is not None:
            for client_id in ids:
                session = sessions[client_id]
                flat.extend((client_id, session.request_no, session.result))
        if len(flat) >= 3 * CHUNK_SESSIONS:
            yield msgpack.packb(flat[: 3 * CHUNK_SESSIONS])
            del flat[: 3 * CHUNK_SESSIONS]
        else:
            yield b""
    if flat:
        yield msgpack.packb(flat)
    yield from app.chunks()


@dataclass(frozen=True, slots=True, kw_only=True)
class ParsedEnvelope:
    index: int
    sessions: Sessions
    app_data: bytes


def parse_envelope(data: bytes) -> ParsedEnvelope:
    """Parse a checkpoint envelope. Raises `SnapshotFormatError` on malformed input."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=True, max_buffer_size=0)
    unpacker.feed(data)
    try:
        header = next(unpacker)
        if (
            not isinstance(header, list)
            or len(header) != 4
            or header[0] != _MAGIC
            or header[1] != _VERSION
            or type(header[2]) is not int
            or type(header[3]) is not int
            or header[2] < 0
            or header[3] < 0
        ):
            raise SnapshotFormatError(f"not a version-{_VERSION} replica checkpoint: {header!r}")
        index: int = header[2]
        remaining: int = header[3]
        pairs: dict[str, Session] = {}
        previous: str | None = None
        while remaining > 0:
            flat = next(unpacker)
            if not isinstance(flat, list) or not flat or len(flat) % 3 or len(flat) > 3 * remaining:
                raise SnapshotFormatError("malformed session chunk in replica checkpoint")
            for i in range(0, len(flat), 3):
                client_id, request_no, result = flat[i], flat[i + 1], flat[i + 2]
                if (
                    type(client_id) is not str
                    or type(request_no) is not int
                    or request_no < 0
                    or type(result) is not bytes
                ):
                    raise SnapshotFormatError("malformed session record in replica checkpoint")
                if previous is not None and not previous < client_id:
                    raise SnapshotFormatError("session client ids not strictly ascending")
                previous = client_id
                pairs[client_id] = Session(request_no=request_no, result=result)
            remaining -= len(flat) // 3
        offset = unpacker.tell()
    except StopIteration:
        raise SnapshotFormatError("replica checkpoint truncated") from None
    except (ValueError, msgpack.UnpackException) as exc:
        raise SnapshotFormatError(f"replica checkpoint unreadable: {exc}") from exc
    return ParsedEnvelope(index=index, sessions=immutables.Map(pairs), app_data=data[offset:])


def encode_meta(meta: SnapshotMeta) -> bytes:
    """The metadata record stored beside a checkpoint: the codec's `SnapshotMeta` frame."""
    return wire.encode(meta)


def decode_meta(data: bytes) -> SnapshotMeta:
    """Inverse of `encode_meta`. Raises `SnapshotFormatError` on malformed input."""
    try:
        return wire.decode(data, expected=SnapshotMeta)
    except DecodeError as exc:
        raise SnapshotFormatError(f"malformed checkpoint metadata: {exc}") from exc
