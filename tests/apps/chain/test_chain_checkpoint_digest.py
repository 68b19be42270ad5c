"""The chain's own checkpoint digest (`CheckpointDigest`, `phalanx.apps.checkpoint_digest`):
the live machine's `state_digest` equals the digest recomputed from its checkpoint bytes;
any change to the state (a leaf, a block's bytes, the supply) changes it or is refused; the
replica hands it to the core with each checkpoint (`CheckpointTaken.digest`) and the same
function of the bytes agrees; the KV store keeps hashing the bytes. PBFT with an injected
digest: checkpoint votes carry it, state transfer installs a checkpoint whose bytes give
the certified digest and refuses a tampered one (control: trusting any data installs it).
The stamp a PBFT entry carries reaches the block header."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import sys
from pathlib import Path

import msgpack  # type: ignore[import-untyped]
import pytest
from chain_helpers import genesis, transfer

from phalanx.apps.chain.block import decode_header
from phalanx.apps.chain.machine import ChainStateMachine
from phalanx.apps.checkpoint_digest import digest_function
from phalanx.apps.interface import BatchInfo, SnapshotFormatError
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.replica import CheckpointPolicy, Replica
from phalanx.consensus.core import Receive
from phalanx.consensus.pbft import PbftCore
from phalanx.consensus.pbft.messages import Checkpoint, CheckpointData
from phalanx.consensus.types import ClientRequest, Configuration, Entry, EntryKind, NodeId
from phalanx.storage.memory import MemoryDisk

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "consensus" / "pbft"))
import pbft_harness


def _blocks(machine: ChainStateMachine, count: int, *, start: int = 1) -> None:
    for i in range(count):
        machine.begin_batch(BatchInfo(index=start + i, timestamp=1000 + i, proposer="n1"))
        machine.apply(transfer(1, start + i, 2, 3))
        machine.end_batch()


def _bytes(machine: ChainStateMachine) -> bytes:
    return b"".join(machine.snapshot().chunks())


def test_state_digest_equals_the_digest_of_the_checkpoint_bytes() -> None:
    m = ChainStateMachine(genesis())
    empty = m.state_digest()
    _blocks(m, 5)
    d = m.state_digest()
    assert d != empty
    assert m.snapshot_digest(_bytes(m)) == d
    again = ChainStateMachine(genesis())
    again.restore(_bytes(m))
    assert again.state_digest() == d
    _blocks(m, 1, start=6)
    assert m.state_digest() != d


def test_a_changed_block_or_state_is_refused_or_changes_the_digest() -> None:
    m = ChainStateMachine(genesis())
    _blocks(m, 3)
    data = _bytes(m)
    objs = _unpack(data)
    blocks = next(o for o in objs if isinstance(o, list) and o and o[0] == "blocks")
    tampered_block = bytearray(blocks[1][-1])
    tampered_block[-1] ^= 1  # the last byte of the last block's txs (a signature byte)
    blocks[1][-1] = bytes(tampered_block)
    forged = b"".join(msgpack.packb(o, use_bin_type=True) for o in objs)
    with contextlib.suppress(SnapshotFormatError):  # refused outright is as good
        assert m.snapshot_digest(forged) != m.state_digest()
    leaves = next(o for o in objs if isinstance(o, list) and o and o[0] == "leaves")
    leaves[1][1] = leaves[1][1][:-1] + bytes([leaves[1][1][-1] ^ 1])
    with pytest.raises(SnapshotFormatError):
        m.snapshot_digest(b"".join(msgpack.packb(o, use_bin_type=True) for o in objs))


def _unpack(data: bytes) -> list[object]:
    u = msgpack.Unpacker(raw=False)
    u.feed(data)
    return list(u)


def _replica(machine: object) -> Replica:
    storage = MemoryDisk("n1").open()
    return Replica(machine,  # type: ignore[arg-type]
                   checkpoints=storage.checkpoints,
                   policy=CheckpointPolicy(every_entries=2, every_bytes=0),
                   config=Configuration(voters=(NodeId("n1"),)))


def _entry(index: int, command: bytes) -> Entry:
    return Entry(index=index, term=1, kind=EntryKind.COMMAND, timestamp=5000 + index,
                 proposer="n2",
                 requests=(ClientRequest(client_id="c", request_no=index, command=command),))


def test_the_replica_hands_the_app_digest_to_the_core_and_kv_keeps_hashing_bytes() -> None:
    r = _replica(ChainStateMachine(genesis()))
    for i in (1, 2):
        r.apply(_entry(i, transfer(1, i, 2, 3)))
    [taken] = r.poll()
    fn = digest_function(r.machine)
    assert fn is not None
    data = bytes(taken.data)  # type: ignore[arg-type]
    assert taken.digest is not None
    assert taken.digest == fn(data) != hashlib.sha256(data).digest()
    assert fn(data[:-1]) == b""  # malformed: no digest, never an exception
    machine = r.machine
    assert isinstance(machine, ChainStateMachine)
    header = decode_header(machine.block(2).header)  # type: ignore[union-attr]
    assert (header.timestamp, header.proposer) == (5002, "n2")  # the entry's stamp
    kv = _replica(KvStateMachine())
    for i in (1, 2):
        kv.apply(_entry(i, b"x"))
    assert [t.digest for t in kv.poll()] == [None]
    assert digest_function(kv.machine) is None


def _app_digest(data: bytes) -> bytes:
    """A stand-in app digest for the PBFT harness (its checkpoints are reprs of lists)."""
    return hashlib.sha256(b"app:" + data).digest()


def _transfer_cluster(monkeypatch: pytest.MonkeyPatch) -> pbft_harness.Cluster:
    monkeypatch.setattr(pbft_harness, "PbftCore",
                        functools.partial(PbftCore, checkpoint_digest=_app_digest))
    c = pbft_harness.Cluster(4, batch_size=1, checkpoint_interval=2, log_window=4)
    late = c.ids[3]
    c.crash(late)
    for no in range(10):
        c.submit(c.ids[0], pbft_harness.req("a", no))
        c.deliver()
    return c


def test_pbft_votes_carry_the_injected_digest_and_state_transfer_checks_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    c = _transfer_cluster(monkeypatch)
    late = c.ids[3]
    votes = [m for _, _, m in c.byz_inbox + c.net if isinstance(m, Checkpoint)]
    stable = c.cores[c.ids[0]].durable_state()
    assert stable.stable_seq >= 6
    assert stable.stable_digest == _app_digest(c.checkpoints[c.ids[0]][stable.stable_seq])
    assert all(v.digest == _app_digest(c.checkpoints[c.ids[0]][v.seq]) for v in votes)
    # A Byzantine peer answers the late replica's fetch with tampered data: refused.
    c.restart(late)
    served: list[CheckpointData] = []

    def tamper(src: NodeId, dst: NodeId, msg: object) -> bool:
        if isinstance(msg, CheckpointData) and dst == late and not served:
            served.append(msg)
            c.step(late, Receive(src=src, message=CheckpointData(
                seq=msg.seq, data=msg.data + b" ", replica=msg.replica)))
            return False
        return True

    c.filter = tamper  # type: ignore[assignment]
    for no in range(10, 16):  # new checkpoints: their votes tell `late` what is stable
        c.submit(c.ids[0], pbft_harness.req("a", no))
        c.tick(1)
        c.deliver()
    assert served, "no state transfer happened"
    assert c.dropped(late).get("bad_checkpoint_digest") == 1
    assert c.app[late][:6] == c.app[c.ids[0]][:6]  # then installed the genuine one
    c.assert_agreement()


def test_control_a_digest_that_ignores_the_data_installs_a_tampered_checkpoint(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Control: votes over a digest that does not bind the bytes let the tampered data in.
    stable: dict[str, bytes] = {}
    monkeypatch.setattr(pbft_harness, "PbftCore", functools.partial(
        PbftCore, checkpoint_digest=lambda data: stable.setdefault("d", b"same")))
    c = pbft_harness.Cluster(4, batch_size=1, checkpoint_interval=2, log_window=4)
    late = c.ids[3]
    c.crash(late)
    for no in range(10):
        c.submit(c.ids[0], pbft_harness.req("a", no))
        c.deliver()
    c.restart(late)

    def tamper(src: NodeId, dst: NodeId, msg: object) -> bool:
        if isinstance(msg, CheckpointData) and dst == late:
            c.step(late, Receive(src=src, message=CheckpointData(
                seq=msg.seq, data=repr(tuple([b"forged"] * msg.seq)).encode(),
                replica=msg.replica)))
            return False
        return True

    c.filter = tamper  # type: ignore[assignment]
    for no in range(10, 16):  # new checkpoints: their votes tell `late` what is stable
        c.submit(c.ids[0], pbft_harness.req("a", no))
        c.tick(1)
        c.deliver()
    assert b"forged" in c.app[late]
    assert c.diverged()



def test_state_transfer_and_restart_load_the_checkpoint_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from phalanx.apps.chain import checkpoint
    loads: list[int] = []
    real = checkpoint.load
    monkeypatch.setattr(checkpoint, "load", lambda data, g: loads.append(1) or real(data, g))
    m = ChainStateMachine(genesis())
    _blocks(m, 3)
    data = _bytes(m)
    fetched = ChainStateMachine(genesis())
    assert fetched.snapshot_digest(data) == m.state_digest()  # state transfer: verify ...
    fetched.restore(data)  # ... then install
    assert len(loads) == 1
    restarted = ChainStateMachine(genesis())
    restarted.restore(data)  # restart: restore ...
    assert restarted.snapshot_digest(data) == m.state_digest()  # ... then the core's digest
    assert len(loads) == 2
    assert restarted.snapshot_digest(data) == m.state_digest()  # the cache holds one use
    assert len(loads) == 3
    assert (fetched.head_hash, fetched.state_root) == (m.head_hash, m.state_root)
