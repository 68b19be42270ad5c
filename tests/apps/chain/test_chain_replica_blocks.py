"""The replica's block boundaries (`BatchHooks`): one committed entry holding a write is one
block, in apply and in WAL replay alike; reads-only entries make none; the proposer comes
from the protocol's rule; an app without hooks is unchanged."""

from __future__ import annotations

import random

from chain_helpers import ACCOUNTS, genesis, transfer

from phalanx.apps.chain.block import decode_header
from phalanx.apps.chain.machine import ChainStateMachine
from phalanx.apps.chain.types import GetHead, encode
from phalanx.apps.replica import CheckpointPolicy, Replica
from phalanx.consensus.types import ClientRequest, Configuration, Entry, EntryKind, NodeId
from phalanx.net import wire
from phalanx.protocols import ProposerRule
from phalanx.protocols import get as protocol_spec
from phalanx.storage.memory import MemoryDisk


def _entry(index: int, *commands: bytes, term: int = 1, reads: int = 0) -> Entry:
    requests = tuple(ClientRequest(client_id=f"c{index}", request_no=i + 1, command=c)
                     for i, c in enumerate(commands))
    requests += tuple(ClientRequest(client_id="r", request_no=0, read_only=True,
                                    command=encode(GetHead())) for _ in range(reads))
    return Entry(index=index, term=term, kind=EntryKind.COMMAND, requests=requests)


def _replica(disk: MemoryDisk, proposer: str = "") -> Replica:
    storage = disk.open()
    return Replica(ChainStateMachine(genesis()), checkpoints=storage.checkpoints,
                   wal=storage.wal, decode_entry=lambda d: wire.decode(d, expected=Entry),
                   policy=CheckpointPolicy(every_entries=3, every_bytes=0),
                   config=Configuration(voters=(NodeId("n1"),)),
                   proposer_of=(lambda term: f"{proposer}{term}") if proposer else None)


ENTRIES = [
    _entry(1, transfer(1, 1, 2, 5), transfer(2, 1, 3, 7)),
    _entry(2, reads=1),
    _entry(3, transfer(1, 1, 2, 5)),  # replayed nonce: refused, the block is empty
    _entry(4, transfer(3, 1, 1, 1), reads=1, term=2),
    _entry(5, transfer(1, 2, 4, 9), transfer(1, 3, 4, 1), term=2),
]


def test_one_entry_with_a_write_is_one_block_and_replay_rebuilds_the_same_chain() -> None:
    disk = MemoryDisk("n1")
    live = _replica(disk, proposer="p")
    wal = live._wal
    assert wal is not None
    for e in ENTRIES:
        wal.append(e.index, wire.encode(e))
        wal.sync()
        live.apply(e)
        live.poll()
    machine = live.machine
    assert isinstance(machine, ChainStateMachine)
    assert machine.height == 4  # entry 2 (reads only) made no block
    blocks = [machine.block(h) for h in range(1, 5)]
    assert all(b is not None for b in blocks)
    headers = [decode_header(b.header) for b in blocks if b is not None]
    assert [len(b.txs) for b in blocks if b is not None] == [2, 0, 1, 2]
    assert [h.proposer for h in headers] == ["p1", "p1", "p2", "p2"]
    assert all(h.timestamp == 0 for h in headers)
    assert machine.balance(ACCOUNTS[4]) == 10
    # recovery: newest checkpoint (index 3) + replay of 4..5 gives the same chain
    again = _replica(disk, proposer="p")
    again.restore_latest()
    restored = again.machine
    assert isinstance(restored, ChainStateMachine)
    assert (restored.height, restored.head_hash, restored.state_root) == (
        machine.height, machine.head_hash, machine.state_root)
    disk.crash(random.Random(1))


def test_builtin_protocols_name_no_proposer() -> None:
    for name in ("raft", "pbft"):
        spec = protocol_spec(name)
        assert spec.proposer_rule is ProposerRule.NONE
        assert spec.proposer_of(7, ("n1", "n2", "n3", "n4")) == ""
