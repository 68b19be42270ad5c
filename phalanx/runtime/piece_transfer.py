"""Shard-level state transfer under trio: serving checkpoint pieces to peers, and fetching
the pieces a received piece manifest names that this node lacks, from several peers at once.

Owns: `PieceTransfer` (both sides, one per node), `Fetched` and `PieceStats`. The core never
sees pieces: a Raft leader's core relays a piece manifest as its snapshot
(`phalanx.runtime.piece_manifest`); the follower's driver, before persisting a Ready that
installs one, awaits `resolve` (`phalanx.runtime.driver_persist`), and the committer's
install (`install_with`) stores the checkpoint from the pieces, so the store keeps them under
the same digests (the node can serve them and send the same manifest later).

Fetching (`resolve`): the pieces the store `lacks` are cut into ranges of `range_bytes`;
each peer gets up to `window` requests of at most `request_bytes` outstanding, peers taken
in turn (a seeded shuffle), so a wiped node fetches from every peer in parallel. A reply is
normal peer input: from another peer than asked, of the wrong shape, a range of the wrong
length (b"": not held there) or a whole piece that fails its SHA-256 is dropped and counted
by reason (`PieceStats.dropped`), and its ranges are asked again, from another peer when one
is left that did not fail that piece (one that failed with ranges from several peers is then
fetched whole from one peer at a time, so the liar is found). A request unanswered for
`timeout_s` is asked again.
Pieces this node holds are read from its own store (checked); one that fails is fetched.

Serving: a `PieceRequest` is checked (shape and bounds) and queued (a full queue drops it:
the fetcher asks again); a worker task reads the ranges on a thread (from the pieces the store
keeps in memory, `phalanx.storage.piece_memory`, else its packs: the page cache or the disk)
and answers one `PieceReply`, b"" for what it does not hold.

Invariants: nothing is installed that failed its digest; peer input never raises here.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import trio

from phalanx.consensus.types import LocalProtocolError, Message, NodeId, SnapshotMeta
from phalanx.runtime.piece_manifest import PieceManifest, PieceStore, decode, is_manifest
from phalanx.runtime.piece_messages import PieceReply, PieceRequest
from phalanx.storage.interface import StorageError
from phalanx.storage.packs import BytesPiece
from phalanx.storage.piece_memory import PieceMemory

__all__ = ["DISABLE_ENV", "Fetched", "PieceStats", "PieceTransfer", "enabled"]

logger = logging.getLogger(__name__)

RANGE_BYTES = 1 << 20
"""Bytes of one range (a large KV shard is asked for in several, from several peers)."""
REQUEST_BYTES = 4 << 20
"""Bytes asked for in one request (the reply stays well under the 16 MiB frame)."""
MAX_RANGES = 256
MAX_REPLY_BYTES = 8 << 20
"""What a server answers at most: larger requests are dropped (`too_large`)."""
WINDOW = 4
TIMEOUT_S = 3.0
SERVE_QUEUE = 16
DISABLE_ENV = "PHALANX_PIECE_TRANSFER"
"""Set to ``off`` (on every node) to send whole checkpoints as before: for a rolling upgrade
from a version without piece transfer (an old node cannot read a manifest), and for the
comparison in `bench/snapshot_catchup.py --full`."""


def enabled(environ: Mapping[str, str]) -> bool:
    """Whether `environ` leaves shard-level state transfer on (`DISABLE_ENV`)."""
    return environ.get(DISABLE_ENV, "on").strip().lower() not in ("off", "0", "no", "false")


@dataclass(slots=True)
class PieceStats:
    """Counters (exported on the metrics page as they grow)."""

    served_ranges: int = 0
    served_bytes: int = 0
    fetched_pieces: int = 0
    fetched_bytes: int = 0
    reused_pieces: int = 0
    resolves: int = 0
    dropped: Counter[str] = field(default_factory=Counter)


@dataclass(slots=True)
class Fetched:
    """A checkpoint assembled from pieces: the pieces in order, each checked."""

    index: int
    manifest: bytes
    pieces: tuple[BytesPiece, ...]
    joined: bytes | None = None

    def data(self) -> bytes:
        """The checkpoint's bytes (one object, made once: the install recognises them)."""
        if self.joined is None:
            self.joined = b"".join(p.raw for p in self.pieces)
        return self.joined


@dataclass(slots=True)
class _Ask:
    peer: NodeId
    units: list[tuple[bytes, int, int]]
    deadline: float


class _Fetch:
    """One `resolve`'s bookkeeping (sizes, parts received, requests out, who failed what)."""

    def __init__(self, sizes: dict[bytes, int], wanted: Sequence[bytes], range_bytes: int
                 ) -> None:
        self.sizes = sizes
        self.units: deque[tuple[bytes, int, int]] = deque()
        self.parts: dict[bytes, dict[int, bytes]] = {}
        self.sources: dict[bytes, set[NodeId]] = {}
        self.refused: dict[bytes, set[NodeId]] = {}
        self.pinned: dict[bytes, NodeId | None] = {}
        """Pieces that failed their digest with ranges from several peers: all their
        ranges go to one peer (None: the next that takes one), so the liar is found."""
        self.quiet_until: dict[NodeId, float] = {}
        self.done: dict[bytes, bytes] = {}
        self.asks: dict[int, _Ask] = {}
        for digest in wanted:
            size = sizes[digest]
            if size == 0:
                self.done[digest] = b""
                continue
            self.parts[digest] = {}
            self.units.extend((digest, at, min(range_bytes, size - at))
                              for at in range(0, size, range_bytes))
        self.changed = trio.Event()

    def unpin(self, ask: _Ask) -> None:
        """`ask` failed as a whole: its pinned pieces may go to another peer."""
        for digest, _, _ in ask.units:
            if self.pinned.get(digest) == ask.peer:
                self.pinned[digest] = None

    def requeue(self, units: Sequence[tuple[bytes, int, int]]) -> None:
        self.units.extendleft(reversed([u for u in units if u[0] not in self.done]))


class PieceTransfer:
    """Serves this node's checkpoint pieces and fetches the ones it lacks (module docstring).

    Args:
        store: this node's checkpoint store (its piece side).
        peers: the nodes to fetch from (every other member).
        send: hands a message to the transport without blocking (False: refused).
        flush: writes what the transport held (`Transport.flush` with `hold_sends`).
        rng: seeds the order peers are asked in.
    """

    def __init__(self, *, store: PieceStore, peers: Sequence[NodeId],
                 send: Callable[[NodeId, Message], bool], flush: Callable[[], None],
                 rng: random.Random, range_bytes: int = RANGE_BYTES,
                 request_bytes: int = REQUEST_BYTES, window: int = WINDOW,
                 timeout_s: float = TIMEOUT_S) -> None:
        if not 0 < range_bytes <= request_bytes <= MAX_REPLY_BYTES:
            raise ValueError("need 0 < range_bytes <= request_bytes <= MAX_REPLY_BYTES")
        self._store = store
        self._peers = list(peers)
        self._send = send
        self._flush = flush
        self._rng = rng
        self._range = range_bytes
        self._request = request_bytes
        self._window = window
        self._timeout = timeout_s
        self._nonce = 0
        self._fetch: _Fetch | None = None
        self._serve_tx, self._serve_rx = trio.open_memory_channel[tuple[NodeId, PieceRequest]](
            SERVE_QUEUE)
        self.fetched: dict[int, Fetched] = {}
        self.stats = PieceStats()

    # ------------------------------------------------------------------ inbound (any task)

    def receive(self, src: NodeId, message: object) -> None:
        """A peer's `PieceRequest` or `PieceReply` (anything else is dropped and counted)."""
        if isinstance(message, PieceRequest):
            why = _check_request(message)
            if why is not None:
                self.stats.dropped[why] += 1
                return
            try:
                self._serve_tx.send_nowait((src, message))
            except trio.WouldBlock:
                self.stats.dropped["serve_queue_full"] += 1
        elif isinstance(message, PieceReply):
            self._on_reply(src, message)
        else:
            self.stats.dropped["not_a_piece_message"] += 1

    def route(self, deliver: Callable[[NodeId, object], Awaitable[None]]
              ) -> Callable[[NodeId, object], Awaitable[None]]:
        """The transport's `deliver`: piece messages here, the rest to `deliver`."""
        receive = self.receive

        async def route(src: NodeId, message: object) -> None:
            if isinstance(message, PieceRequest | PieceReply):
                receive(src, message)
            else:
                await deliver(src, message)

        return route

    def counters(self) -> dict[str, int]:
        """The counters for the metrics page (`NodeMetrics.add_byte_source`)."""
        s = self.stats
        out = {"piece_served_ranges": s.served_ranges, "piece_served_bytes": s.served_bytes,
               "piece_fetched_pieces": s.fetched_pieces,
               "piece_fetched_bytes": s.fetched_bytes, "piece_reused_pieces": s.reused_pieces,
               "piece_resolves": s.resolves}
        out.update((f"piece_dropped_{why}", n) for why, n in s.dropped.items())
        memory = getattr(self._store, "memory", None)
        if isinstance(memory, PieceMemory):
            out.update(piece_memory_bytes=memory.size, piece_memory_hits=memory.hits,
                       piece_memory_misses=memory.misses,
                       piece_served_from_memory_bytes=memory.hit_bytes)
        return out

    # ------------------------------------------------------------------ serving

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Answer queued requests, one at a time, until cancelled."""
        task_status.started()
        async for src, request in self._serve_rx:
            chunks = await trio.to_thread.run_sync(self._read_ranges, request)
            self.stats.served_ranges += sum(1 for c in chunks if c)
            self.stats.served_bytes += sum(map(len, chunks))
            if self._send(src, PieceReply(nonce=request.nonce, chunks=tuple(chunks))):
                self._flush()
            else:
                self.stats.dropped["reply_refused"] += 1

    def _read_ranges(self, request: PieceRequest) -> list[bytes]:
        out = []
        for digest, offset, length in zip(request.digests, request.offsets, request.lengths,
                                          strict=True):
            try:
                out.append(self._store.read_piece_range(digest, offset, length))
            except StorageError:
                out.append(b"")
        return out

    # ------------------------------------------------------------------ fetching

    def install_with(self, install: Callable[..., None]
                     ) -> Callable[[SnapshotMeta, bytes], None]:
        """The committer's install: a snapshot that is a piece manifest is installed from
        the pieces `resolve` fetched for it (`install(meta, data, pieces=...)`), any other
        as it is (`install(meta, data)`).

        Raises (from the returned function):
            LocalProtocolError: a manifest nothing was fetched for (our own misuse: the
                driver resolves before it persists).
        """
        def installing(meta: SnapshotMeta, data: bytes) -> None:
            if not is_manifest(data):
                got = self.fetched.get(meta.index)
                if got is not None and got.joined is data:  # assembled for the core (PBFT)
                    install(meta, data, pieces=got.pieces)
                    self.fetched.pop(meta.index, None)
                else:
                    install(meta, data)
                return
            got = self.fetched.get(meta.index)
            if got is None:
                raise LocalProtocolError(f"piece manifest for checkpoint {meta.index} was not "
                                   "resolved before it was installed")
            install(meta, got.data(), pieces=got.pieces)
            self.fetched.pop(meta.index, None)

        return installing

    async def resolve(self, data: bytes, *, rounds: int | None = None) -> None:
        """Fetch what the piece manifest `data` names and this node lacks, then keep the
        assembled checkpoint in `fetched` for the install. Returns at once for bytes that
        are not a valid manifest (the install then refuses them as it refuses any malformed
        checkpoint). Retries until every piece is had (the leader pins what it sent), or,
        with `rounds`, gives up (counted: `gave_up`) after that many rounds in which no peer
        served what was left (a Byzantine sender's manifest may name pieces nobody has)."""
        manifest = decode(data)
        if isinstance(manifest, str):
            self.stats.dropped["bad_manifest"] += 1
            return
        for old in [i for i in self.fetched if i < manifest.index]:
            del self.fetched[old]
        known = self.fetched.get(manifest.index)
        if known is not None and known.manifest == data:
            return
        self.stats.resolves += 1
        sizes = dict(manifest.pieces)
        digests = list(sizes)
        missing = await trio.to_thread.run_sync(self._store.lacks, digests)
        while True:
            got = await self._fetch_all(sizes, missing, rounds)
            if got is None:
                self.stats.dropped["gave_up"] += 1
                return
            pieces, missing = await trio.to_thread.run_sync(self._assemble, manifest, got)
            if pieces is not None:
                self.fetched[manifest.index] = Fetched(manifest.index, data, pieces)
                return
            self.stats.dropped["own_piece_unreadable"] += len(missing)

    def _assemble(self, manifest: PieceManifest, got: dict[bytes, bytes]
                  ) -> tuple[tuple[BytesPiece, ...] | None, list[bytes]]:
        """The pieces in manifest order (own ones read and checked), or the digests of own
        pieces that failed (to fetch)."""
        own: dict[bytes, bytes] = {}
        failed = []
        for digest, _ in manifest.pieces:
            if digest in got or digest in own:
                continue
            try:
                own[digest] = self._store.read_piece(digest)
            except StorageError:
                failed.append(digest)
        if failed:
            return None, failed
        self.stats.reused_pieces += len(own)
        return tuple(BytesPiece(d, got[d] if d in got else own[d])
                     for d, _ in manifest.pieces), []

    async def _fetch_all(self, sizes: dict[bytes, int], wanted: Sequence[bytes],
                         rounds: int | None) -> dict[bytes, bytes] | None:
        fetch = self._fetch = _Fetch(sizes, wanted, self._range)
        peers = list(self._peers)
        self._rng.shuffle(peers)
        quiet_until = fetch.quiet_until
        try:
            while len(fetch.done) < len(wanted):
                now = trio.current_time()
                for nonce, ask in list(fetch.asks.items()):
                    if ask.deadline <= now:
                        del fetch.asks[nonce]
                        self.stats.dropped["timeout"] += 1
                        fetch.unpin(ask)
                        fetch.requeue(ask.units)
                sent = self._assign(fetch, peers, quiet_until, now)
                if sent:
                    self._flush()
                if fetch.units and not fetch.asks and not sent:
                    # Every peer failed what is left (or none is reachable): forget who
                    # failed what and try them all again after a pause.
                    self.stats.dropped["no_peer_holds"] += 1
                    if rounds is not None:
                        rounds -= 1
                        if rounds <= 0:
                            return None
                    logger.warning("fetching checkpoint pieces: no peer served %d ranges; "
                                   "asking again", len(fetch.units))
                    fetch.refused.clear()
                    fetch.pinned = dict.fromkeys(fetch.pinned)
                    quiet_until.clear()
                    await trio.sleep(self._timeout)
                    continue
                fetch.changed = trio.Event()
                with trio.move_on_after(0.05):
                    await fetch.changed.wait()
        finally:
            self._fetch = None
        return fetch.done

    def _assign(self, fetch: _Fetch, peers: list[NodeId], quiet_until: dict[NodeId, float],
                now: float) -> int:
        """Send requests to peers with a free window slot, in turn; returns how many."""
        busy = Counter(ask.peer for ask in fetch.asks.values())
        sent = 0
        progress = True
        while fetch.units and progress:
            progress = False
            for peer in peers:
                if busy[peer] >= self._window or quiet_until.get(peer, 0.0) > now:
                    continue
                units = _take(fetch, peer, self._request)
                if not units:
                    continue
                self._nonce += 1
                request = PieceRequest(nonce=self._nonce, digests=tuple(u[0] for u in units),
                                       offsets=tuple(u[1] for u in units),
                                       lengths=tuple(u[2] for u in units))
                if not self._send(peer, request):
                    self.stats.dropped["send_refused"] += 1
                    fetch.requeue(units)
                    quiet_until[peer] = now + self._timeout
                    continue
                fetch.asks[self._nonce] = _Ask(peer, units, now + self._timeout)
                busy[peer] += 1
                sent += 1
                progress = True
                if not fetch.units:
                    break
        return sent

    def _on_reply(self, src: NodeId, reply: PieceReply) -> None:
        fetch = self._fetch
        ask = None if fetch is None else fetch.asks.get(reply.nonce)
        if fetch is None or ask is None:
            self.stats.dropped["stale_reply"] += 1
            return
        if ask.peer != src:
            self.stats.dropped["wrong_peer"] += 1
            return
        del fetch.asks[reply.nonce]
        fetch.changed.set()
        if len(reply.chunks) != len(ask.units):
            self.stats.dropped["malformed_reply"] += 1
            fetch.quiet_until[src] = trio.current_time() + self._timeout
            fetch.unpin(ask)
            fetch.requeue(ask.units)
            return
        retry = []
        for unit, chunk in zip(ask.units, reply.chunks, strict=True):
            digest, offset, length = unit
            parts = fetch.parts.get(digest)
            if parts is None:  # done meanwhile (asked twice after a timeout)
                continue
            if len(chunk) != length:
                self.stats.dropped["not_held" if not chunk else "bad_length"] += 1
                fetch.refused.setdefault(digest, set()).add(src)
                if fetch.pinned.get(digest) == src:
                    fetch.pinned[digest] = None
                retry.append(unit)
                continue
            parts[offset] = chunk
            fetch.sources.setdefault(digest, set()).add(src)
            if sum(map(len, parts.values())) == fetch.sizes[digest]:
                self._complete(fetch, digest, parts)
        fetch.requeue(retry)

    def _complete(self, fetch: _Fetch, digest: bytes, parts: dict[int, bytes]) -> None:
        raw = b"".join(parts[at] for at in sorted(parts))
        del fetch.parts[digest]
        sources = fetch.sources.pop(digest, set())
        if not digest_ok(raw, digest):
            self.stats.dropped["bad_digest"] += 1
            if len(sources) == 1:  # that peer lied (or its disk did)
                fetch.refused.setdefault(digest, set()).update(sources)
            fetch.pinned[digest] = None
            fetch.parts[digest] = {}
            size = fetch.sizes[digest]
            fetch.requeue([(digest, at, min(self._range, size - at))
                           for at in range(0, size, self._range)])
            return
        fetch.done[digest] = raw
        self.stats.fetched_pieces += 1
        self.stats.fetched_bytes += len(raw)


def digest_ok(raw: bytes, digest: bytes) -> bool:
    """Whether `raw` is the piece named `digest` (a test disables it as a control)."""
    return hashlib.sha256(raw).digest() == digest


def _take(fetch: _Fetch, peer: NodeId, budget: int) -> list[tuple[bytes, int, int]]:
    """Up to `budget` bytes of queued ranges `peer` has not failed (in queue order)."""
    units: list[tuple[bytes, int, int]] = []
    skipped: list[tuple[bytes, int, int]] = []
    size = 0
    while fetch.units and len(units) < MAX_RANGES:
        unit = fetch.units[0]
        if units and size + unit[2] > budget:
            break
        fetch.units.popleft()
        pin = fetch.pinned.get(unit[0], peer)
        if peer in fetch.refused.get(unit[0], ()) or pin not in (None, peer):
            skipped.append(unit)
            if len(skipped) > 4 * MAX_RANGES:
                break
            continue
        if unit[0] in fetch.pinned:
            fetch.pinned[unit[0]] = peer
        units.append(unit)
        size += unit[2]
    fetch.units.extendleft(reversed(skipped))
    return units


def _check_request(request: PieceRequest) -> str | None:
    n = len(request.digests)
    if not n or n > MAX_RANGES or len(request.offsets) != n or len(request.lengths) != n:
        return "malformed_request"
    if any(len(d) != 32 for d in request.digests) or any(o < 0 for o in request.offsets):
        return "malformed_request"
    if any(x < 0 for x in request.lengths) or sum(request.lengths) > MAX_REPLY_BYTES:
        return "too_large"
    return None
