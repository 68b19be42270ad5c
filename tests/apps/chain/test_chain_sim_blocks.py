"""Block boundaries are the same on every replica under faults: the simulator runs Raft and
PBFT (kills, restarts, partitions, view changes, state transfer) with a KV store that also
implements `BatchHooks` and folds every batch (index, proposer, timestamp, the commands it
applied) into a hash chain carried in its checkpoints; every replica must reach the same
hash at every batch index. Test-only: the simulator's `KvStateMachine` is replaced in the
protocol setups by monkeypatching, so no simulator code (or trace hash) changes."""

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

SEEN: dict[int, set[bytes]] = {}


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
        return self.chain

    def snapshot(self) -> Any:
        return _Snapshot(self.chain, super().snapshot())

    def restore(self, data: bytes) -> None:
        super().restore(data[32:])
        self.chain = data[:32]


# PBFT seeds 7 and 11 have view changes after which replicas executed the same sequence
# numbers in different views: a proposer derived from the entry's term (the view) splits the
# chains there (3 of 12 seeds did), which is why `ProposerRule.NONE` names none.
@pytest.mark.parametrize(("protocol", "nodes", "module", "seeds"),
                         [("raft", 3, sim_raft, (1, 2)), ("pbft", 4, sim_pbft, (7, 11))])
def test_every_replica_builds_the_same_blocks_under_faults(
        monkeypatch: pytest.MonkeyPatch, protocol: str, nodes: int, module: Any,
        seeds: tuple[int, ...]) -> None:
    monkeypatch.setattr(module, "KvStateMachine", HookedKv)
    batches = 0
    for seed in seeds:
        SEEN.clear()
        result = sim_run.run(sim_run.RunConfig(seed=seed, protocol=protocol, nodes=nodes,
                                               time_ns=2_000_000_000))
        assert result.ok, result.report()
        split = {i: len(h) for i, h in SEEN.items() if len(h) > 1}
        assert not split, f"replicas disagree on the blocks at indexes {sorted(split)[:5]}"
        batches += len(SEEN)
    assert batches > 20
