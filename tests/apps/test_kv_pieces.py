"""The KV checkpoint as content-addressed pieces: `KvSnapshot.pieces` is the `chunks` stream
with each shard known by its SHA-256, a shard no write touched keeps its digest (so it is
neither serialised nor hashed again), and a replica checkpointing into a v3 store writes only
the shards that changed and restores the same state from them.
"""

from __future__ import annotations

import hashlib

from phalanx.apps import kv_wire
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_checkpoint import ShardPiece
from phalanx.apps.kv_types import Put
from phalanx.apps.replica import CheckpointPolicy, Replica
from phalanx.apps.writer import InlineCheckpointWriter
from phalanx.consensus.types import ClientRequest, Configuration, Entry, EntryKind, NodeId
from phalanx.storage.checkpoint import FileCheckpointStore
from phalanx.storage.memory import MemoryDirectory

KEYS = 20_000


def loaded(keys: int = KEYS) -> KvStateMachine:
    machine = KvStateMachine()
    for i in range(keys):
        machine.execute(Put(key=f"key{i:06d}", value=b"value %d" % i))
    return machine


def fresh(pieces: list[object]) -> int:
    """How many shards the walk serialised and hashed (no cached digest)."""
    return sum(1 for p in pieces if isinstance(p, ShardPiece) and p._raw is not None)


def test_pieces_are_the_chunks_with_each_shard_known_by_its_digest() -> None:
    machine = loaded()
    pieces = list(machine.snapshot().pieces())
    data = b"".join(p if isinstance(p, bytes) else p.data() for p in pieces)
    assert data == b"".join(machine.snapshot().chunks())
    shards = [p for p in pieces if isinstance(p, ShardPiece)]
    assert len(shards) > 10
    assert all(hashlib.sha256(p.data()).digest() == p.digest for p in shards)
    # again, nothing written: every shard keeps its digest and is not serialised
    again = list(machine.snapshot().pieces())
    assert fresh(again) == 0
    assert [p.digest for p in again if isinstance(p, ShardPiece)] == [p.digest for p in shards]
    # one write touches one shard; a rewrite with a same-length value (spliced) too
    machine.execute(Put(key="key012345", value=b"changed"))
    after = list(machine.snapshot().pieces())
    assert fresh(after) == 1
    machine.execute(Put(key="key000007", value=b"value 8"))
    assert fresh(list(machine.snapshot().pieces())) == 1
    restored = KvStateMachine()
    restored.restore(b"".join(p if isinstance(p, bytes) else p.data()
                              for p in machine.snapshot().pieces()))
    assert b"".join(restored.snapshot().chunks()) == b"".join(machine.snapshot().chunks())


def _put(index: int, key: str) -> Entry:
    command = kv_wire.encode_command(Put(key=key, value=b"v%d" % index))
    request = ClientRequest(client_id="c", request_no=index, command=command)
    return Entry(index=index, term=1, kind=EntryKind.COMMAND, requests=(request,))


def test_a_replica_checkpoint_writes_only_the_changed_shards() -> None:
    store = FileCheckpointStore(MemoryDirectory("r"), keep=2)
    machine = loaded()
    replica = Replica(machine, checkpoints=store, writer=InlineCheckpointWriter(store),
                      policy=CheckpointPolicy(every_entries=0, every_bytes=0),
                      config=Configuration(voters=(NodeId("n1"),)))
    replica.apply(_put(1, "key000001"))
    assert replica.checkpoint_now()
    replica.poll()
    full = store.stats.written
    replica.apply(_put(2, "key015000"))
    assert replica.checkpoint_now()
    replica.poll()
    assert store.stats.new_pieces <= 2  # the envelope's header (the index) and one shard
    assert store.stats.written < full / 5
    again = Replica(KvStateMachine(), checkpoints=store,
                    policy=CheckpointPolicy(every_entries=0, every_bytes=0))
    report = again.restore_latest()
    assert report.checkpoint_index == 2
    assert report.problems == ()
    assert b"".join(again.machine.snapshot().chunks()) == b"".join(machine.snapshot().chunks())
