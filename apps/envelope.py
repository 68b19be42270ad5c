"""The replica checkpoint envelope: applied index, session table, transaction table, then the
application's state.

Owns: the on-disk (and on-wire, for state transfer) format of a replica checkpoint, its
bounded-step serialiser and its strict parser; and the format of the small metadata record
stored beside each checkpoint (`SnapshotMeta`, as a codec frame).

Must not import: consensus cores, storage backends, trio, clocks.

Format (version 2: a replica in session mode), concatenated:
    msgpack ["phalanx.replica", 2, applied_index, session_count, tombstone_count]
    msgpack [client_id, request_no, result, last_index, client_id, ...]  # <= CHUNK_SESSIONS
    ... repeated until session_count sessions, client ids strictly ascending
    the same for tombstone_count tombstones (result b""), client ids strictly ascending
    the application's checkpoint bytes (the rest of the data; see its own format)
Version 3 (a replica in transaction mode, `phalanx.apps.transactions`): the header gains
tx_count and max_deadline_ms (``[..., tombstone_count, tx_count, max_deadline_ms]``), and
after the tombstones come tx_count records ``[tx_id, deadline_ms, result, tx_id, ...]``
(<= CHUNK_SESSIONS a chunk, tx ids strictly ascending). A session-mode replica still writes
version 2, byte for byte as before.
Version 1 (still read): header without tombstone_count, records without last_index (read
as 0), no tombstones. See `phalanx.apps.sessions` for what last_index and tombstones mean.

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

from phalanx.apps.interface import (
    PiecedSnapshot,
    SnapshotFormatError,
    StatePiece,
    StateSnapshot,
)
from phalanx.apps.sorted_steps import sorted_in_steps
from phalanx.apps.transactions import TxRecord, TxRecords
from phalanx.consensus._fastpath import raw_init
from phalanx.consensus.types import SnapshotMeta
from phalanx.net import wire
from phalanx.net.codec import DecodeError

CHUNK_SESSIONS = 2048
"""Sessions per checkpoint array (part of the format)."""
SORT_RUN = 2048
STEP_SESSIONS = 256
"""Sessions handled per serialisation step (bounds the work of one step)."""
_MAGIC = "phalanx.replica"
_VERSION = 2
_TX_VERSION = 3
_NO_TXS: TxRecords = immutables.Map()


@raw_init  # built once per applied write
@dataclass(frozen=True, slots=True, kw_only=True)
class Session:
    """A client's deduplication record: its latest applied request and the cached reply
    (Raft dissertation §6.3)."""

    request_no: int
    result: bytes
    last_index: int = 0
    """The applied index at which this request ran (orders expiry: `phalanx.apps.sessions`)."""


Sessions = immutables.Map[str, Session]


def envelope_chunks(
    *, index: int, sessions: Sessions, app: StateSnapshot,
    tombstones: Sessions | None = None,
    transactions: TxRecords | None = None,
    max_deadline_ms: int = 0,
) -> Iterator[bytes]:
    """Serialise a checkpoint in bounded steps (each `next()` does bounded work; steps with no
    output yet yield `b""`). With `transactions` (a replica in transaction mode) the format is
    version 3, else version 2."""
    for chunk in envelope_pieces(index=index, sessions=sessions, app=app, tombstones=tombstones,
                                 transactions=transactions, max_deadline_ms=max_deadline_ms):
        yield chunk if isinstance(chunk, bytes) else chunk.data()


def envelope_pieces(
    *, index: int, sessions: Sessions, app: StateSnapshot,
    tombstones: Sessions | None = None,
    transactions: TxRecords | None = None,
    max_deadline_ms: int = 0,
) -> Iterator[bytes | StatePiece]:
    """`envelope_chunks` with the app's pieces as they are (`PiecedSnapshot.pieces`, when the
    app's snapshot offers them): what the replica hands a content-addressed store."""
    tombs: Sessions = tombstones if tombstones is not None else immutables.Map()
    if transactions is None:
        yield msgpack.packb([_MAGIC, _VERSION, index, len(sessions), len(tombs)])
    else:
        yield msgpack.packb([_MAGIC, _TX_VERSION, index, len(sessions), len(tombs),
                             len(transactions), max_deadline_ms])
    yield from _records(sessions)
    yield from _records(tombs)
    if transactions is not None:
        yield from _tx_records(transactions)
    if isinstance(app, PiecedSnapshot):
        yield from app.pieces()
    else:
        yield from app.chunks()


def _tx_records(records: TxRecords) -> Iterator[bytes]:
    flat: list[object] = []
    for ids in sorted_in_steps(records.keys(), run=SORT_RUN, step=STEP_SESSIONS):
        if ids is not None:
            for tx_id in ids:
                record = records[tx_id]
                flat.extend((tx_id, record.deadline_ms, record.result))
        if len(flat) >= 3 * CHUNK_SESSIONS:
            yield msgpack.packb(flat[: 3 * CHUNK_SESSIONS])
            del flat[: 3 * CHUNK_SESSIONS]
        else:
            yield b""
    if flat:
        yield msgpack.packb(flat)


def _records(sessions: Sessions) -> Iterator[bytes]:
    flat: list[object] = []
    for ids in sorted_in_steps(sessions.keys(), run=SORT_RUN, step=STEP_SESSIONS):
        if ids is not None:
            for client_id in ids:
                session = sessions[client_id]
                flat.extend((client_id, session.request_no, session.result,
                             session.last_index))
        if len(flat) >= 4 * CHUNK_SESSIONS:
            yield msgpack.packb(flat[: 4 * CHUNK_SESSIONS])
            del flat[: 4 * CHUNK_SESSIONS]
        else:
            yield b""
    if flat:
        yield msgpack.packb(flat)


@dataclass(frozen=True, slots=True, kw_only=True)
class ParsedEnvelope:
    index: int
    sessions: Sessions
    app_data: bytes
    tombstones: Sessions
    version: int = _VERSION
    transactions: TxRecords = _NO_TXS
    """The transaction table (version 3; empty before)."""
    max_deadline_ms: int = 0


def parse_envelope(data: bytes) -> ParsedEnvelope:
    """Parse a checkpoint envelope (version 1, 2 or 3). Raises `SnapshotFormatError` on
    malformed input."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=True, max_buffer_size=0)
    unpacker.feed(data)
    try:
        header = next(unpacker)
        if (
            not isinstance(header, list)
            or len(header) not in (4, 5, 7)
            or header[0] != _MAGIC
            or header[1] not in (1, 2, 3)
            or len(header) != (header[1] + 3 if header[1] < 3 else 7)
            or any(type(v) is not int or v < 0 for v in header[2:6])
            or (len(header) == 7 and type(header[6]) is not int)
        ):
            raise SnapshotFormatError(f"not a version 1 to 3 replica checkpoint: {header!r}")
        index: int = header[2]
        width = 3 if header[1] == 1 else 4
        sessions = _parse_records(unpacker, header[3], width)
        tombs = _parse_records(unpacker, header[4], width) if width == 4 else {}
        txs = _parse_tx_records(unpacker, header[5]) if header[1] == 3 else {}
        offset = unpacker.tell()
    except StopIteration:
        raise SnapshotFormatError("replica checkpoint truncated") from None
    except (ValueError, msgpack.UnpackException) as exc:
        raise SnapshotFormatError(f"replica checkpoint unreadable: {exc}") from exc
    return ParsedEnvelope(index=index, sessions=immutables.Map(sessions),
                          tombstones=immutables.Map(tombs), app_data=data[offset:],
                          version=header[1], transactions=immutables.Map(txs),
                          max_deadline_ms=header[6] if header[1] == 3 else 0)


def _parse_tx_records(unpacker: msgpack.Unpacker, remaining: int) -> dict[bytes, TxRecord]:
    records: dict[bytes, TxRecord] = {}
    previous: bytes | None = None
    while remaining > 0:
        flat = next(unpacker)
        if (not isinstance(flat, list) or not flat or len(flat) % 3
                or len(flat) > 3 * remaining):
            raise SnapshotFormatError("malformed transaction chunk in replica checkpoint")
        for i in range(0, len(flat), 3):
            tx_id, deadline_ms, result = flat[i], flat[i + 1], flat[i + 2]
            if type(tx_id) is not bytes or type(deadline_ms) is not int or (
                    type(result) is not bytes):
                raise SnapshotFormatError("malformed transaction record in replica checkpoint")
            if previous is not None and not previous < tx_id:
                raise SnapshotFormatError("transaction ids not strictly ascending")
            previous = tx_id
            records[tx_id] = TxRecord(deadline_ms=deadline_ms, result=result)
        remaining -= len(flat) // 3
    return records


def _parse_records(unpacker: msgpack.Unpacker, remaining: int, width: int
                   ) -> dict[str, Session]:
    pairs: dict[str, Session] = {}
    previous: str | None = None
    while remaining > 0:
        flat = next(unpacker)
        if (not isinstance(flat, list) or not flat or len(flat) % width
                or len(flat) > width * remaining):
            raise SnapshotFormatError("malformed session chunk in replica checkpoint")
        for i in range(0, len(flat), width):
            client_id, request_no, result = flat[i], flat[i + 1], flat[i + 2]
            last_index = flat[i + 3] if width == 4 else 0
            if (
                type(client_id) is not str
                or type(request_no) is not int
                or request_no < 0
                or type(result) is not bytes
                or type(last_index) is not int
                or last_index < 0
            ):
                raise SnapshotFormatError("malformed session record in replica checkpoint")
            if previous is not None and not previous < client_id:
                raise SnapshotFormatError("session client ids not strictly ascending")
            previous = client_id
            pairs[client_id] = Session(request_no=request_no, result=result,
                                       last_index=last_index)
        remaining -= len(flat) // width
    return pairs


def encode_meta(meta: SnapshotMeta) -> bytes:
    """The metadata record stored beside a checkpoint: the codec's `SnapshotMeta` frame."""
    return wire.encode(meta)


def decode_meta(data: bytes) -> SnapshotMeta:
    """Inverse of `encode_meta`. Raises `SnapshotFormatError` on malformed input."""
    try:
        return wire.decode(data, expected=SnapshotMeta)
    except DecodeError as exc:
        raise SnapshotFormatError(f"malformed checkpoint metadata: {exc}") from exc



def split_header(data: bytes) -> tuple[list[object], int]:
    """(the header of checkpoint envelope `data`, the offset where the rest begins). Raises
    `SnapshotFormatError` on a malformed header."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=True, max_buffer_size=0)
    unpacker.feed(data)
    try:
        header = next(unpacker)
        offset = unpacker.tell()
    except (StopIteration, ValueError, msgpack.UnpackException):
        raise SnapshotFormatError("replica checkpoint header unreadable") from None
    if (not isinstance(header, list) or len(header) < 3 or header[0] != _MAGIC
            or type(header[2]) is not int):
        raise SnapshotFormatError(f"not a replica checkpoint header: {header!r}")
    return header, offset


def rebased_header(header: list[object], index: int) -> bytes:
    """`header` (from `split_header`) packed with its applied index set to `index`."""
    if index < 0:
        raise ValueError(f"index must be >= 0, got {index}")
    return bytes(msgpack.packb([*header[:2], index, *header[3:]]))


def rebase_envelope(data: bytes, index: int) -> bytes:
    """`data` (a checkpoint envelope, any version) with its applied index replaced by
    `index`, everything after the header byte for byte unchanged. The leaderless core's
    state transfer serves checkpoints rebased to index 0 (replicas number their entries
    locally, so only the content is comparable across replicas) and installs them rebased
    to its own next index. Raises `SnapshotFormatError` on a malformed header."""
    header, offset = split_header(data)
    return rebased_header(header, index) + data[offset:]
