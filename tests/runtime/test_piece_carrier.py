"""PBFT's `CheckpointData` with pieces (`phalanx.runtime.piece_carrier`), over the fake network
of `test_piece_transfer`: the sender's runtime puts the piece manifest in place of the bytes,
the receiver's fetches the pieces and hands its core the message with the assembled bytes
(which the core then checks against the certified digest); other messages pass unchanged,
and a checkpoint not stored in pieces is sent whole.
"""

from __future__ import annotations

import trio
from test_piece_transfer import INDEX, Net, current, store_with

from phalanx.consensus.pbft.messages import CheckpointData, FetchCheckpoint
from phalanx.consensus.types import Message, NodeId
from phalanx.protocols.pbft_node import PIECE_CARRIER
from phalanx.runtime.piece_carrier import CarrierLink
from phalanx.runtime.piece_manifest import is_manifest
from phalanx.storage.checkpoint import FileCheckpointStore
from phalanx.storage.memory import MemoryDirectory


async def test_checkpoint_data_travels_as_a_manifest_and_arrives_whole() -> None:
    raws, data = current()
    store = store_with(raws)
    net = Net("a", "b", "f")
    net.add("a", store)
    net.add("b", store_with(raws))
    follower_store = FileCheckpointStore(MemoryDirectory())
    follower = net.add("f", follower_store)
    sent: list[Message] = []
    send = CarrierLink(PIECE_CARRIER, net.nodes[NodeId("a")], store).outgoing(
        lambda to, m: sent.append(m) is None)
    assert send(NodeId("f"), CheckpointData(seq=INDEX, data=data, replica=NodeId("a")))
    other = FetchCheckpoint(seq=INDEX, replica=NodeId("a"))
    send(NodeId("f"), other)
    send(NodeId("f"), CheckpointData(seq=99, data=b"not in pieces", replica=NodeId("a")))
    carried = sent[0]
    assert isinstance(carried, CheckpointData)
    assert is_manifest(carried.data)
    assert len(carried.data) < 2000
    assert sent[1] is other
    assert sent[2] == CheckpointData(seq=99, data=b"not in pieces", replica=NodeId("a"))
    link = CarrierLink(PIECE_CARRIER, follower, follower_store)
    delivered: list[object] = []
    both = trio.Event()

    async def deliver(src: NodeId, message: object) -> None:
        delivered.append(message)
        if len(delivered) == 2:
            both.set()

    receiving = link.incoming(deliver)
    async with trio.open_nursery() as nursery:
        for node in net.nodes.values():
            nursery.start_soon(node.run)
        await nursery.start(link.run, deliver)
        await receiving(NodeId("a"), other)  # not a carrier: straight through
        await receiving(NodeId("a"), carried)
        with trio.fail_after(10):
            await both.wait()
        nursery.cancel_scope.cancel()
    assert delivered[0] is other
    assert delivered[1] == CheckpointData(seq=INDEX, data=data, replica=NodeId("a"))
    assert follower.stats.fetched_bytes == len(data)
