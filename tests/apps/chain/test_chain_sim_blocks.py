"""Block boundaries and block stamps are the same on every replica under faults: the simulator
runs Raft and PBFT (kills, restarts, partitions, view changes, state transfer) with a KV
store that also implements `BatchHooks` (so it asks for block stamps: the cores stamp each
batch with the proposer's clock and id) and `CheckpointDigest` (PBFT's checkpoint votes
and state transfer use its digest) and folds every batch (index, proposer, timestamp,
the commands it applied) into a hash chain carried in its checkpoints; every replica must
reach the same hash at every batch index, every batch must carry a real stamp (a timestamp
on the simulated wall clock, a member as proposer), and the timestamps never decrease.
Test-only: the simulator's `KvStateMachine` is replaced in the protocol setups by
monkeypatching, so the KV runs (and their trace hashes) are unchanged."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest

from phalanx.apps.interface import BatchInfo
from phalanx.apps.kv import KvStateMachine
from phalanx.jepsen.sim import pbft as sim_pbft
from phalanx.jepsen.sim import raft as sim_raft
from phalanx.jepsen.sim import run as sim_run
from phalanx.jepsen.sim.node import SIM_EPOCH_MS

SEEN: dict[int, set[bytes]] = {}
STAMPS: dict[int, set[tuple[int, str]]] = {}


class _Snapshot:
    def __init__(self, head: bytes, inner: Any) -> None:
        self._head, self._inner = head, inner

    def chunks(self) -> Iterator[bytes]:
        yield self._head
        yield from self._inner.chunks()


class HookedKv(KvStateMachine):
    """The KV store plus a hash chain over its batches (in its snapshots)."""

    def __init__(self) -> None:
        super().__init__()
        self.chain = bytes(32)
        self._open: BatchInfo | None = None
        self._commands = hashlib.sha256()

    def begin_batch(self, info: BatchInfo) -> None:
        assert self._open is None
        self._open = info
        self._commands = hashlib.sha256()

    def apply(self, command: bytes) -> bytes:
        if self._open is not None:
            self._commands.update(hashlib.sha256(command).digest())
        return super().apply(command)

    def end_batch(self) -> bytes:
        info = self._open
        assert info is not None
        self._open = None
        self.chain = hashlib.sha256(
            self.chain + info.index.to_bytes(8, "big") + info.proposer.encode()
            + info.timestamp.to_bytes(8, "big") + self._commands.digest()).digest()
        SEEN.setdefault(info.index, set()).add(self.chain)
        STAMPS.setdefault(info.index, set()).add((info.timestamp, info.proposer))
        return self.chain

    def snapshot(self) -> Any:
        return _Snapshot(self.chain, super().snapshot())

    def restore(self, data: bytes) -> None:
        super().restore(data[32:])
        self.chain = data[:32]

    # `CheckpointDigest`: PBFT's checkpoint votes carry this digest (state transfer checks
    # fetched checkpoints against it), as they carry the chain app's.
    def state_digest(self) -> bytes:
        kv = b"".join(super().snapshot().chunks())
        return hashlib.sha256(b"hooked" + self.chain + hashlib.sha256(kv).digest()).digest()

    def snapshot_digest(self, data: bytes) -> bytes:
        KvStateMachine().restore(data[32:])  # as strict as `restore`
        return hashlib.sha256(b"hooked" + data[:32] + hashlib.sha256(data[32:]).digest()).digest()


# PBFT seeds 7 and 11 have view changes after which replicas executed the same sequence
# numbers in different views: a proposer derived from the entry's term (the view) split the
# chains there (3 of 12 seeds did); the block stamp's proposer (who signed the original
# pre-prepare, covered by the digest) does not.
@pytest.mark.parametrize(("protocol", "nodes", "module", "seeds"),
                         [("raft", 3, sim_raft, (1, 2)), ("pbft", 4, sim_pbft, (7, 11))])
def test_every_replica_builds_the_same_blocks_under_faults(
        monkeypatch: pytest.MonkeyPatch, protocol: str, nodes: int, module: Any,
        seeds: tuple[int, ...]) -> None:
    monkeypatch.setattr(module, "KvStateMachine", HookedKv)
    nodes_named = {f"n{i}" for i in range(1, nodes + 1)}
    batches = 0
    for seed in seeds:
        SEEN.clear()
        STAMPS.clear()
        result = sim_run.run(sim_run.RunConfig(seed=seed, protocol=protocol, nodes=nodes,
                                               time_ns=2_000_000_000))
        assert result.ok, result.report()
        split = {i: len(h) for i, h in SEEN.items() if len(h) > 1}
        assert not split, (f"seed {seed}: replicas disagree on the blocks at indexes "
                           f"{sorted(split)[:5]} (replay: pytest {__file__} -k {protocol})")
        stamps = [next(iter(STAMPS[i])) for i in sorted(STAMPS)]
        assert all(len(STAMPS[i]) == 1 for i in STAMPS)
        assert all(ts >= SIM_EPOCH_MS and who in nodes_named for ts, who in stamps), stamps[:3]
        times = [ts for ts, _ in stamps]
        assert times == sorted(times), f"seed {seed}: block time went backwards"
        batches += len(SEEN)
    assert batches > 20
