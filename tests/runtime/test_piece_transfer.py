"""Shard-level state transfer (`phalanx.runtime.piece_transfer`) between in-process nodes
over a fake network: a follower fetches only the pieces it lacks, in parallel from every
peer; a Byzantine peer's corrupt piece, a peer that lost its pieces, a malformed reply and a
lost reply are dropped and counted, and the piece is fetched from another peer; with only
liars to ask, nothing is ever installed. Piece manifests round-trip and never raise on
damaged input.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.consensus.types import Configuration, Message, NodeId, SnapshotMeta
from phalanx.runtime import piece_manifest, piece_transfer
from phalanx.runtime.piece_manifest import ManifestData, ManifestViews
from phalanx.runtime.piece_messages import PieceReply, PieceRequest
from phalanx.runtime.piece_transfer import PieceTransfer
from phalanx.storage.checkpoint import FileCheckpointStore
from phalanx.storage.memory import MemoryDirectory
from phalanx.storage.packs import BytesPiece

INDEX = 10


def shards(n: int, seed: int, size: int = 3000) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(size) for _ in range(n)]


def store_with(raws: Sequence[bytes], index: int = INDEX) -> FileCheckpointStore:
    store = FileCheckpointStore(MemoryDirectory(), keep=3)
    store.save_stream(index, b"meta", [BytesPiece(hashlib.sha256(r).digest(), r) for r in raws])
    return store


class Net:
    """Delivers messages between `PieceTransfer`s at once; `tamper` may rewrite a reply."""

    def __init__(self, *members: str) -> None:
        self.members = members
        self.nodes: dict[NodeId, PieceTransfer] = {}
        self.tamper: dict[NodeId, Callable[[PieceReply], PieceReply | None]] = {}
        self.sent: dict[NodeId, int] = {}

    def add(self, name: str, store: FileCheckpointStore, seed: int = 0) -> PieceTransfer:
        me = NodeId(name)

        def send(to: NodeId, message: Message) -> bool:
            if to not in self.nodes:
                return False
            if isinstance(message, PieceReply):
                self.sent[me] = self.sent.get(me, 0) + sum(map(len, message.chunks))
                if me in self.tamper:
                    changed = self.tamper[me](message)
                    if changed is None:
                        return True  # lost
                    message = changed
            self.nodes[to].receive(me, message)
            return True

        peers = [NodeId(n) for n in self.members if n != name]
        node = PieceTransfer(store=store, peers=peers, send=send, flush=lambda: None,
                             rng=random.Random(seed), range_bytes=64 << 10,
                             request_bytes=64 << 10, timeout_s=0.3)
        self.nodes[me] = node
        return node


async def fetch(net: Net, follower: PieceTransfer, manifest: bytes, *, within: float = 10
                ) -> bool:
    async with trio.open_nursery() as nursery:
        for node in net.nodes.values():
            nursery.start_soon(node.run)
        with trio.move_on_after(within):
            await follower.resolve(manifest)
        nursery.cancel_scope.cancel()
    return INDEX in follower.fetched


def current() -> tuple[list[bytes], bytes]:
    """The leader's checkpoint: 40 small shards and one large piece (several ranges)."""
    raws = [*shards(40, seed=1), random.Random(9).randbytes(300_000)]
    return raws, b"".join(raws)


async def test_follower_fetches_only_what_it_lacks_from_every_peer() -> None:
    raws, data = current()
    leader_store = store_with(raws)
    old = [*shards(36, seed=1), *shards(4, seed=2)]  # missed 4 shards and the big piece
    follower_store = store_with(old, index=5)
    net = Net("a", "b", "c", "f")
    net.add("a", leader_store)
    net.add("b", store_with(raws))
    net.add("c", store_with(raws))
    follower = net.add("f", follower_store)
    manifest = ManifestViews(leader_store).read_view(INDEX)
    assert isinstance(manifest, ManifestData)
    assert len(manifest) < 2000
    assert await fetch(net, follower, manifest[:])
    lacked = raws[36:]
    assert follower.stats.fetched_bytes == sum(map(len, lacked))
    assert follower.stats.fetched_pieces == len(lacked)
    assert follower.stats.reused_pieces == 36
    assert sum(net.sent.values()) == sum(map(len, lacked))  # nothing asked twice
    assert len([n for n in net.sent.values() if n]) >= 2  # from several peers in parallel
    assert not follower.stats.dropped
    installed: list[tuple[SnapshotMeta, bytes, object]] = []

    def install(meta: SnapshotMeta, got: bytes, *, pieces: object = None) -> None:
        installed.append((meta, got, pieces))
        if isinstance(pieces, tuple):
            follower_store.save_stream(meta.index, b"meta", pieces)

    meta = SnapshotMeta(index=INDEX, term=1, config=Configuration(voters=(NodeId("a"),)))
    follower.install_with(install)(meta, manifest[:])
    assert installed[0][1] == data
    assert follower_store.piece_list(INDEX) == leader_store.piece_list(INDEX)
    assert follower_store.load_latest().checkpoint.data == data  # type: ignore[union-attr]
    follower.install_with(install)(meta, b"plain")  # not a manifest: installed as it is
    assert installed[-1][1:] == (b"plain", None)


def corrupt(reply: PieceReply) -> PieceReply:
    return PieceReply(nonce=reply.nonce,
                      chunks=tuple(bytes([c[0] ^ 1]) + c[1:] if c else c for c in reply.chunks))


async def test_byzantine_and_empty_peers_are_dropped_and_counted() -> None:
    raws, data = current()
    leader_store = store_with(raws)
    net = Net("a", "b", "c", "x", "f")
    net.add("a", leader_store)
    net.add("x", store_with(raws))  # Byzantine: flips a bit in every chunk it sends
    net.tamper[NodeId("x")] = corrupt
    net.add("b", FileCheckpointStore(MemoryDirectory()))  # wiped: holds nothing
    net.add("c", store_with(raws))
    net.tamper[NodeId("c")] = lambda reply: None if reply.nonce % 2 else PieceReply(
        nonce=reply.nonce, chunks=reply.chunks[:-1] or (b"?",))  # loses or mangles all
    follower = net.add("f", FileCheckpointStore(MemoryDirectory()), seed=3)
    manifest = ManifestViews(leader_store).read_view(INDEX)[:]
    assert await fetch(net, follower, manifest)
    assert follower.fetched[INDEX].data() == data
    dropped = follower.stats.dropped
    assert dropped["bad_digest"] > 0
    assert dropped["not_held"] > 0
    assert dropped["malformed_reply"] + dropped["timeout"] > 0, dropped


async def test_nothing_is_installed_when_only_liars_hold_the_pieces() -> None:
    raws, _ = current()
    net = Net("x", "f")
    leader_store = store_with(raws)
    net.add("x", leader_store)
    net.tamper[NodeId("x")] = corrupt
    follower = net.add("f", FileCheckpointStore(MemoryDirectory()))
    manifest = ManifestViews(leader_store).read_view(INDEX)[:]
    assert not await fetch(net, follower, manifest, within=1.0)
    assert follower.stats.dropped["bad_digest"] > 0
    assert follower.stats.dropped["no_peer_holds"] > 0


async def test_control_without_the_hash_check_a_liar_gets_through(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The deliberate bug the tests above must catch: no check of a piece's SHA-256."""
    monkeypatch.setattr(piece_transfer, "digest_ok", lambda raw, digest: True)
    raws, data = current()
    net = Net("x", "f")
    leader_store = store_with(raws)
    net.add("x", leader_store)
    net.tamper[NodeId("x")] = corrupt
    follower = net.add("f", FileCheckpointStore(MemoryDirectory()))
    assert await fetch(net, follower, ManifestViews(leader_store).read_view(INDEX)[:])
    assert follower.fetched[INDEX].data() != data  # corrupt, and it would be installed


async def test_bad_requests_and_manifests_are_dropped() -> None:
    net = Net("a", "f")
    server = net.add("a", store_with(shards(3, seed=1)))
    server.receive(NodeId("f"), PieceRequest(nonce=1, digests=(b"x",), offsets=(0,),
                                              lengths=(1,)))
    server.receive(NodeId("f"), PieceRequest(nonce=2, digests=(b"x" * 32,), offsets=(0,),
                                              lengths=(1 << 30,)))
    server.receive(NodeId("f"), PieceReply(nonce=7, chunks=()))
    server.receive(NodeId("f"), "junk")
    assert dict(server.stats.dropped) == {"malformed_request": 1, "too_large": 1,
                                          "stale_reply": 1, "not_a_piece_message": 1}
    await server.resolve(b"PHXPMAN1 but not really one")
    assert server.stats.dropped["bad_manifest"] == 1
    assert not server.fetched


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.binary(min_size=32, max_size=32), st.integers(0, 2**32 - 1)),
                max_size=20), st.integers(0, 2**64 - 1), st.data())
def test_manifest_round_trips_and_damage_never_raises(
        pieces: list[tuple[bytes, int]], index: int, data: st.DataObject) -> None:
    raw = piece_manifest.encode(index, pieces)
    got = piece_manifest.decode(raw)
    assert not isinstance(got, str)
    assert (got.index, got.pieces) == (index, tuple(pieces))
    at = data.draw(st.integers(0, len(raw) - 1))
    damaged = raw[:at] + bytes([raw[at] ^ data.draw(st.integers(1, 255))]) + raw[at + 1:]
    assert isinstance(piece_manifest.decode(damaged), str)
    assert isinstance(piece_manifest.decode(raw[:at]), str)


def test_views_of_old_checkpoints_are_sent_whole() -> None:
    store = FileCheckpointStore(MemoryDirectory(), layout=2)
    store.save_stream(3, b"m", [b"abc"])
    view = ManifestViews(store).read_view(3)
    assert not isinstance(view, ManifestData)
    assert view[:] == b"abc"


@pytest.fixture(autouse=True)
def _registered() -> None:
    from phalanx.runtime import piece_messages
    piece_messages.register()
