"""Leaderless state transfer (`state_transfer.py`, `phalanx.protocols.leaderless_checkpoints`):
descriptors identify a checkpoint's content whatever its local index, a fetch starts only on
f+1 matching descriptors, and a Byzantine server's forged bytes are refused (with a control:
without the digest check they go in). The core's install and the scenarios past the GC
horizon are `tests/jepsen/sim/test_leaderless_state_transfer_sim.py`."""

from __future__ import annotations

from collections.abc import Callable

import immutables
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.apps import kv_wire
from phalanx.apps.envelope import envelope_chunks, parse_envelope
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_types import Put
from phalanx.apps.transactions import TxRecord
from phalanx.consensus.core import Send
from phalanx.consensus.leaderless import state_transfer
from phalanx.consensus.leaderless.state_transfer import StateTransfer, Verified
from phalanx.consensus.leaderless.transfer_messages import (
    TRANSFER_MESSAGES,
    CheckpointChunk,
    CheckpointDescriptor,
    CheckpointDescriptors,
    CheckpointQuery,
    FetchCheckpoint,
)
from phalanx.consensus.types import Message, NodeId
from phalanx.net import wire
from phalanx.protocols.leaderless_checkpoints import EnvelopeFormat, applied_digest

FMT = EnvelopeFormat()
NODES = tuple(NodeId(f"n{i}") for i in range(1, 5))


def checkpoint(index: int, value: bytes, ids: tuple[bytes, ...] = (b"a" * 32, b"b" * 32)
               ) -> bytes:
    kv = KvStateMachine()
    kv.apply(kv_wire.encode_command(Put(key="k", value=value)))
    txs = immutables.Map({t: TxRecord(deadline_ms=1000 + i, result=b"")
                          for i, t in enumerate(ids)})
    return b"".join(envelope_chunks(index=index, sessions=immutables.Map(), app=kv.snapshot(),
                                    transactions=txs, max_deadline_ms=1000 + len(ids)))


def test_the_descriptor_names_the_content_not_the_local_index() -> None:
    a, b = FMT.describe(checkpoint(5, b"x")), FMT.describe(checkpoint(9, b"x"))
    assert a is not None
    assert b is not None
    assert a.descriptor == b.descriptor
    other = FMT.describe(checkpoint(5, b"y"))
    assert other is not None
    assert other.descriptor.state_digest != a.descriptor.state_digest
    assert other.descriptor.applied_digest == a.descriptor.applied_digest  # same ids
    rebased = FMT.rebase(checkpoint(5, b"x"), 12)
    assert rebased is not None
    assert parse_envelope(rebased).index == 12
    assert FMT.applied(rebased) == {b"a" * 32: 1000, b"b" * 32: 1001}
    assert FMT.describe(b"garbage") is None
    assert FMT.applied(b"garbage") is None
    assert FMT.rebase(b"\x00", 3) is None


@settings(max_examples=30, deadline=None)
@given(st.lists(st.binary(min_size=32, max_size=32), unique=True, max_size=12), st.randoms())
def test_the_applied_digest_is_order_free(ids: list[bytes], rnd: object) -> None:
    shuffled = list(ids)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert applied_digest(shuffled) == applied_digest(ids)
    if ids:
        assert applied_digest(ids[1:]) != applied_digest(ids)


class Net:
    """Four `StateTransfer`s (f = 1) wired by hand; `serve` gives each server its data."""

    def __init__(self, *, check_digest: bool = True, forgotten: tuple[bytes, ...] = ()) -> None:
        """`forgotten`: what every node applied and no longer holds (the coverage rule)."""
        wire.register_all(TRANSFER_MESSAGES)
        self.drops: dict[NodeId, list[str]] = {n: [] for n in NODES}
        self.asked: list[int] = []
        """The `max_deadline_ms` the coverage rule was asked about."""

        def forgot(max_deadline_ms: int) -> tuple[bytes, ...]:
            self.asked.append(max_deadline_ms)
            return forgotten
        self.machines = {n: StateTransfer(
            fmt=FMT, peers=tuple(p for p in NODES if p != n), faults=1, every=2,
            drop=self.drops[n].append, check_digest=check_digest, forgotten=forgot)
            for n in NODES}
        self.forged: dict[NodeId, bytes] = {}
        self.verified: list[Verified] = []
        self.applied: dict[NodeId, int] = {}
        self.vouch: dict[NodeId, Callable[[int], bool]] = {}
        """A node's vouch rule (default: its current state only, `at`)."""

    def take(self, node: NodeId, index: int, data: bytes) -> None:
        """`node` checkpointed at `index` and applied nothing since (a quiet point)."""
        self.machines[node].taken(data, index)
        self.applied[node] = index

    def deliver(self, src: NodeId, sends: list[Send]) -> None:
        queue = [(src, s) for s in sends]
        while queue:
            frm, send = queue.pop(0)
            msg: Message = wire.decode(wire.encode(send.message), expected=Message)
            to = send.to
            m = self.machines[to]
            if isinstance(msg, CheckpointQuery):
                out = m.on_query(frm, self.vouch.get(to) or at(self.applied.get(to, 0)))
            elif isinstance(msg, CheckpointDescriptor | CheckpointDescriptors):
                out = m.on_descriptor(frm, msg)
            elif isinstance(msg, FetchCheckpoint):
                out = m.on_fetch(frm, msg)
                if to in self.forged:  # the liar serves other bytes under that digest
                    data = self.forged[to][msg.offset:msg.offset + state_transfer.CHUNK_BYTES]
                    out = [Send(to=frm, message=CheckpointChunk(
                        state_digest=msg.state_digest, offset=msg.offset, data=data))]
            else:
                assert isinstance(msg, CheckpointChunk)
                out, got = m.on_chunk(frm, msg)
                if got is not None:
                    self.verified.append(got)
            queue += [(to, s) for s in out]

    def run(self, node: NodeId, ticks: int = 40) -> None:
        self.machines[node].want("test")
        for _ in range(ticks):
            self.deliver(node, self.machines[node].tick())
            if self.verified:
                return


@pytest.mark.parametrize("chunk", [7, 1 << 20])
def test_forged_bytes_from_a_byzantine_server_are_refused(
        monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    """n1 (the first server in sorted order) reports the honest descriptor but serves another
    valid checkpoint: n4 drops it as forged and installs the honest one from n2."""
    monkeypatch.setattr(state_transfer, "CHUNK_BYTES", chunk)
    net = Net()
    honest, forged = checkpoint(7, b"honest"), checkpoint(7, b"forged")
    for n in NODES[:3]:
        net.take(n, 7, honest)
    net.forged[NodeId("n1")] = FMT.rebase(forged, 0) or b""
    net.run(NodeId("n4"))
    assert [v.data for v in net.verified] == [FMT.rebase(honest, 0)]
    assert "forged_checkpoint" in net.drops[NodeId("n4")]


def test_without_the_digest_check_the_forged_state_goes_in() -> None:
    """The control (`skip_checkpoint_digest`): the same liar's bytes are accepted."""
    net = Net(check_digest=False)
    honest, forged = checkpoint(7, b"honest"), checkpoint(7, b"forged")
    for n in NODES[:3]:
        net.take(n, 7, honest)
    net.forged[NodeId("n1")] = FMT.rebase(forged, 0) or b""
    net.run(NodeId("n4"))
    assert [v.data for v in net.verified] == [FMT.rebase(forged, 0)]


def test_a_descriptor_only_f_peers_report_is_never_fetched() -> None:
    """One liar announcing a state nobody else holds gets no fetch; the f+1 honest one wins."""
    net = Net()
    net.take(NodeId("n1"), 3, checkpoint(3, b"lie", (b"z" * 32,)))
    for n in NODES[1:3]:
        net.take(n, 4, checkpoint(4, b"truth"))
    net.run(NodeId("n4"))
    assert [v.data for v in net.verified] == [FMT.rebase(checkpoint(4, b"truth"), 0)]
    net2 = Net()
    net2.take(NodeId("n1"), 3, checkpoint(3, b"lie"))
    net2.take(NodeId("n2"), 4, checkpoint(4, b"truth"))
    net2.run(NodeId("n4"))
    assert net2.verified == []  # no two peers agree: nothing is fetched


def test_a_node_holding_the_agreed_state_stops_asking() -> None:
    net = Net()
    for n in NODES:
        net.take(n, 2 + len(n), checkpoint(2 + len(n), b"same"))
    net.run(NodeId("n4"))
    assert net.verified == []
    assert not net.machines[NodeId("n4")].need


def test_bad_requests_and_chunks_are_dropped_not_raised() -> None:
    net = Net()
    m = net.machines[NodeId("n1")]
    net.take(NodeId("n1"), 1, checkpoint(1, b"v"))
    assert m.on_fetch(NodeId("n2"), FetchCheckpoint(state_digest=b"x" * 32, offset=0)) == []
    own = m.own()
    assert own is not None
    assert m.on_fetch(NodeId("n2"), FetchCheckpoint(
        state_digest=own.descriptor.state_digest, offset=own.descriptor.size)) == []
    assert m.on_chunk(NodeId("n2"), CheckpointChunk(state_digest=b"x", offset=0,
                                                    data=b"y")) == ([], None)
    huge = CheckpointDescriptor(applied_digest=b"a" * 32, state_digest=b"s" * 32,
                                size=state_transfer.MAX_CHECKPOINT_BYTES + 1, tx_count=0,
                                max_deadline_ms=0)
    assert m.on_descriptor(NodeId("n2"), huge) == []
    assert net.drops[NodeId("n1")] == ["unknown_checkpoint", "unknown_checkpoint",
                                       "unexpected_checkpoint_chunk", "oversized_checkpoint"]


def at(applied: int) -> Callable[[int], bool]:
    """The core's vouch rule at a quiet point: only the current state."""
    return lambda index: index == applied


def test_a_node_without_a_checkpoint_still_answers() -> None:
    """`NO_CHECKPOINT`: the asker hears an answer (its silence detector) and records no vote."""
    net = Net()
    m = net.machines[NodeId("n1")]
    assert [s.message for s in m.on_query(NodeId("n2"), at(0))] == [state_transfer.NO_CHECKPOINT]
    net.take(NodeId("n1"), 5, checkpoint(5, b"v"))
    assert [s.message for s in m.on_query(NodeId("n2"), at(6))] == [state_transfer.NO_CHECKPOINT]
    assert [s.message for s in m.on_query(NodeId("n2"), at(5))] != [state_transfer.NO_CHECKPOINT]
    net.machines[NodeId("n2")].want("test")
    assert net.machines[NodeId("n2")].on_descriptor(NodeId("n1"),
                                                    state_transfer.NO_CHECKPOINT) == []
    assert net.drops[NodeId("n2")] == []


def test_a_retained_checkpoint_two_peers_share_is_agreed() -> None:
    """Under load: n1 and n2 both checkpointed one applied set (a cut), then each a newer,
    different one. Each vouches for the checkpoints it retains (`RETAINED`, newest first:
    `CheckpointDescriptors`), so the shared older one has f+1 reports and n4 installs it.
    With only the current state vouched for (the quiet-point rule) nothing is agreed."""
    for only_current in (False, True):
        net = Net()
        shared = checkpoint(5, b"cut", (b"a" * 32, b"b" * 32))
        for n, value in ((NodeId("n1"), b"x"), (NodeId("n2"), b"y")):
            net.take(n, 5, shared)
            net.take(n, 8, checkpoint(8, value, (b"a" * 32, b"b" * 32, value * 32)))
            net.applied[n] = 9
            if not only_current:
                net.vouch[n] = lambda index: True
        net.run(NodeId("n4"))
        if only_current:
            assert net.verified == []
        else:
            assert [v.data for v in net.verified] == [FMT.rebase(shared, 0)]


def test_only_the_last_retained_checkpoints_are_served() -> None:
    net = Net()
    n1 = net.machines[NodeId("n1")]
    for i in range(1, state_transfer.RETAINED + 2):
        net.take(NodeId("n1"), i, checkpoint(i, b"v%d" % i))
    (answer,) = [s.message for s in n1.on_query(NodeId("n4"), lambda index: True)]
    assert isinstance(answer, CheckpointDescriptors)
    expect = [FMT.describe(checkpoint(i, b"v%d" % i)) for i in
              range(state_transfer.RETAINED + 1, 1, -1)]
    assert list(answer.descriptors) == [d.descriptor for d in expect if d is not None]


A, B, X = b"a" * 32, b"b" * 32, b"x" * 32


def _two_agreed(net: Net) -> tuple[bytes, bytes]:
    """n1 and n2 vouch for `lacking` (ids a, b, and c: the greater descriptor, tried first),
    n2 and n3 for `covering` (a and x): both have f+1 = 2 reports."""
    lacking, covering = checkpoint(4, b"old", (A, B, b"c" * 32)), checkpoint(3, b"new", (A, X))
    net.take(NodeId("n1"), 4, lacking)
    net.take(NodeId("n2"), 3, covering)
    net.take(NodeId("n2"), 4, lacking)
    net.vouch[NodeId("n2")] = lambda index: True
    net.take(NodeId("n3"), 3, covering)
    return lacking, covering


def test_a_checkpoint_lacking_a_forgotten_apply_is_refused() -> None:
    """The coverage rule (issue 15, seed 87): n4 applied x and forgot it (its core no longer
    holds it). The greatest agreed checkpoint lacks x: verified, then refused, and the next
    agreed one, which records x, is fetched and handed over at once (no new round)."""
    net = Net(forgotten=(X,))
    lacking, covering = _two_agreed(net)
    net.run(NodeId("n4"))
    n4 = net.machines[NodeId("n4")]
    assert [v.data for v in net.verified] == [FMT.rebase(covering, 0)]
    assert n4.refused_lacking == 1
    assert net.asked == [1003, 1002]  # asked about each checkpoint's newest deadline
    control = Net()  # the rule off (`install_over_forgotten`): the lacking one goes in
    _two_agreed(control)
    control.run(NodeId("n4"))
    assert [v.data for v in control.verified] == [FMT.rebase(lacking, 0)]


def test_without_a_covering_checkpoint_the_node_keeps_asking() -> None:
    """Only the lacking checkpoint is agreed: nothing is handed over, the transfer stays
    wanted, and the refused checkpoint is never fetched again in later rounds."""
    net = Net(forgotten=(X,))
    for n in NODES[:3]:
        net.take(n, 4, checkpoint(4, b"old", (A, B)))
    net.run(NodeId("n4"), ticks=20)
    n4 = net.machines[NodeId("n4")]
    assert net.verified == []
    assert n4.need
    assert n4.refused_lacking == 1  # fetched once, then refused for good
    net.take(NodeId("n1"), 5, checkpoint(5, b"new", (A, B, X)))
    net.take(NodeId("n2"), 5, checkpoint(5, b"new", (A, B, X)))
    net.run(NodeId("n4"), ticks=20)  # a covering one appears: it goes in
    assert [v.data for v in net.verified] == [FMT.rebase(checkpoint(5, b"new", (A, B, X)), 0)]


def test_lacking_names_what_the_table_does_not_record() -> None:
    assert state_transfer.lacking({A: 1, B: 2}, (X, A, b"y" * 32)) == [X, b"y" * 32]
    assert state_transfer.lacking({A: 1}, ()) == []
