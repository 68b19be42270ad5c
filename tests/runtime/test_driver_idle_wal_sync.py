"""The driver's idle WAL sync (`PersistPipeline._sync_when_idle`): log records written by
batches that did not sync (the leaderless core's commit Readys) are fsynced on the worker
thread once the node is idle, so the next `must_sync` batch does not pay for them; with
fsync off (`persist_inline`) nothing extra happens.

The core is a stand-in returning fixed Readys; synchronisation is by `wait_for`, never by
elapsed time.
"""

from __future__ import annotations

import random

import trio
from runtime_helpers import wait_for

from phalanx.apps.kv import KvStateMachine
from phalanx.apps.replica import Replica
from phalanx.consensus.core import CoreStatus, Input, Ready
from phalanx.consensus.types import ClientRequest, Entry, EntryKind, NodeId
from phalanx.net import wire
from phalanx.net.client_protocol import ClientCall, ClientReply, StatusReply
from phalanx.runtime.driver import Driver
from phalanx.runtime.group_commit import GroupCommitter
from phalanx.runtime.persistence import ReadyPersister
from phalanx.storage.memory import MemoryDisk

N1 = NodeId("n1")


class UnsyncedAppends:
    """Each batch of client requests appends one entry WITHOUT `must_sync` (as a leaderless
    commit Ready does: its durability lives in the core's journal)."""

    node_id = N1

    def __init__(self) -> None:
        self.index = 0

    def propose(self, requests: tuple[ClientRequest, ...]) -> Ready:
        self.index += 1
        entry = Entry(index=self.index, term=0, kind=EntryKind.NOOP)
        return Ready(number=self.index, entries=(entry,))

    def step(self, inp: Input, /) -> Ready:
        return Ready()

    def status(self) -> CoreStatus:
        return CoreStatus(node=N1, role="member", term=0, commit_index=0, leader=None)


class Sink:
    def deliver(self, reply: ClientReply | StatusReply) -> None:
        pass


def _driver(disk: MemoryDisk, *, persist_inline: bool = False) -> tuple[Driver, GroupCommitter]:
    storage = disk.open()
    committer = GroupCommitter(
        ReadyPersister(wal=storage.wal, hard_state=storage.hard_state,
                       checkpoints=storage.checkpoints, codec=wire.default_registry()),
        install=None, saved=None)
    core = UnsyncedAppends()

    def status_reply(nonce: int, status: CoreStatus, replica: Replica) -> StatusReply:
        raise AssertionError("not used")

    replica = Replica(KvStateMachine(), checkpoints=MemoryDisk("r").open().checkpoints)
    driver = Driver(core=core, replica=replica, committer=committer,
                    send=lambda to, message: True, tick_seconds=3600.0,
                    status_reply=status_reply, propose_batch=core.propose,
                    persist_inline=persist_inline)
    return driver, committer


def _call(n: int) -> ClientCall:
    return ClientCall(request=ClientRequest(client_id="c", request_no=n, command=b"x"))


async def test_an_idle_driver_fsyncs_log_records_no_batch_synced() -> None:
    disk = MemoryDisk("n1")
    driver, committer = _driver(disk)
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await driver.call(_call(1), Sink())
        await wait_for(lambda: committer.idle_syncs == 1 and not driver.busy)
        assert not committer.wal_unsynced
        assert driver.stats.idle_syncs == 1
        await driver.call(_call(2), Sink())
        await wait_for(lambda: committer.idle_syncs == 2 and not driver.busy)
        nursery.cancel_scope.cancel()
    assert committer.batches >= 4  # two appends, two idle syncs
    # Both entries survive any power loss now (without the idle sync a crash may keep
    # any prefix of them: a torn or lost record).
    for seed in range(8):
        disk.crash(random.Random(seed))
        assert disk.open().wal.last_index() == 2, f"seed {seed}"


async def test_no_idle_sync_with_fsync_off() -> None:
    driver, committer = _driver(MemoryDisk("n1"), persist_inline=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await driver.call(_call(1), Sink())
        await wait_for(lambda: committer.batches == 1)
        for _ in range(5):
            await trio.lowlevel.checkpoint()
        nursery.cancel_scope.cancel()
    assert committer.idle_syncs == 0
    assert driver.stats.idle_syncs == 0
    assert committer.wal_unsynced
