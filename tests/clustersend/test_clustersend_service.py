"""The clustersend node service without a network: its certificate gathering inside the
sending cluster, its drops of bad `CsSign`s, its answer to a late (restarted) signer, and
exactly-once inbox application (also of credits) however many times a value is submitted.
Peer sends and consensus submissions are recorded; the KV state is a real `KvStateMachine`
the test applies commands to."""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_types import CsPrune, Put
from phalanx.apps.kv_wire import decode_command, encode_command
from phalanx.clustersend import (
    AckProof,
    AckStatement,
    Certificate,
    ClusterSendConfig,
    CsConfirm,
    CsEcho,
    CsSend,
    Inbound,
    MemberSignature,
    SendStatement,
    certify,
    value_digest,
)
from phalanx.consensus.types import Message, NodeId
from phalanx.net import wire
from phalanx.net.crypto import Ed25519Crypto
from phalanx.net.intercluster import qualify
from phalanx.protocols.spec import FaultModel
from phalanx.services.clustersend_apply import ApplyCheck, delivery_command
from phalanx.services.clustersend_node import (
    CLUSTERSEND_SERVICE_MESSAGES,
    ClusterSendService,
    CsSign,
    Mailbox,
    credit_value,
    outbox_command,
)
from phalanx.services.linked_keys import cluster_info

A, B = "clusterA", "clusterB"
RAFT = cluster_info(A, ("n1", "n2", "n3"), FaultModel.CRASH)
PBFT = cluster_info(B, ("n1", "n2", "n3", "n4"), FaultModel.BYZANTINE)
KEYS = {m: Ed25519PrivateKey.generate() for m in RAFT.members + PBFT.members}
wire.register_all(CLUSTERSEND_SERVICE_MESSAGES)


def crypto(me: NodeId) -> Ed25519Crypto:
    return Ed25519Crypto(me, private_key=KEYS[me], public_keys={
        m: k.public_key() for m, k in KEYS.items()}, mac_keys={})


class Harness:
    def __init__(self, cluster: str, node: str, *, gc: bool = False) -> None:
        own, other = (RAFT, PBFT) if cluster == A else (PBFT, RAFT)
        self.sent: list[tuple[NodeId, Message]] = []
        self.submitted: list[bytes] = []
        self.state = KvStateMachine()
        self.state.install_delivery_check(ApplyCheck(
            own=own.cluster_id, linked={other.cluster_id: other},
            verifier=crypto(qualify(node, cluster))))
        self.service = ClusterSendService(
            me=qualify(node, cluster), cluster=own, linked=(other,),
            crypto=crypto(qualify(node, cluster)),
            send=lambda to, m: self.sent.append((to, m)) is None,
            submit=lambda c: self.submitted.append(c) is None,
            mailbox=Mailbox(self.state), tick_seconds=0.02,
            config=ClusterSendConfig(attempt_timeout=5), resubmit=3, gc=gc, gc_batch=2)

    def take(self) -> list[tuple[NodeId, Message]]:
        out, self.sent = self.sent, []
        return out


def _sign(node: str, st: SendStatement) -> CsSign:
    me = qualify(node, A)
    return CsSign(statement=st, signature=MemberSignature(signer=me, sig=crypto(me).sign(st)))


def test_members_gather_a_crash_certificate_and_send_it_across() -> None:
    members = {n: Harness(A, n) for n in ("n1", "n2", "n3")}
    for h in members.values():
        h.state.apply(outbox_command(B, 0, b"hello"))  # the same committed state
        h.service.tick()
    h = members["n1"]
    signs = [(to, m) for to, m in h.take() if isinstance(m, CsSign)]
    assert sorted(to for to, _ in signs) == ["n2", "n3"]  # our own members: plain ids
    st = signs[0][1].statement
    assert (st.src_cluster, st.dst_cluster, st.seq, st.digest) == (A, B, 0,
                                                                   value_digest(b"hello"))
    crossing = []
    for name, member in members.items():
        member.take()
        other = "n2" if name != "n2" else "n3"
        member.service.receive(NodeId(other), _sign(other, st))  # a majority of 3
        assert member.service.counters()["certified"] == 1
        crossing += [(to, m) for to, m in member.take() if isinstance(m, CsSend)]
    assert len(crossing) == 1  # attempt 0's one sender, to its one receiver
    assert crossing[0][0].endswith(f"@{B}")  # a linked node: qualified id
    assert crossing[0][1].value == b"hello"
    # A member that signs long after (it restarted) gets our signature back; a prompt one
    # does not (it has ours already).
    for _ in range(4):
        h.service.tick()
    h.take()
    h.service.receive(NodeId("n3"), _sign("n3", st))
    assert [(to, type(m).__name__) for to, m in h.take()] == [("n3", "CsSign")]


def test_bad_signatures_are_dropped_and_counted() -> None:
    h = Harness(A, "n1")
    h.state.apply(outbox_command(B, 0, b"v"))
    h.service.tick()
    st = h.service._sending[(B, 0)].statement
    other = SendStatement(src_cluster=A, dst_cluster=B, epoch=0, seq=0,
                          digest=value_digest(b"w"))
    forged = CsSign(statement=st, signature=MemberSignature(signer=qualify("n2", A),
                                                            sig=b"\0" * 64))
    h.service.receive(NodeId("n2"), forged)
    h.service.receive(NodeId("n2"), _sign("n2", other))
    h.service.receive(qualify("n2", B), _sign("n2", st))  # a linked node is not a member
    h.service.receive(NodeId("n3"), _sign("n2", st))  # signer != sender
    c = h.service.counters()
    assert c["dropped:sign_bad_signature"] == 1
    assert c["dropped:sign_other_value"] == 1
    assert c["dropped:sign_not_member"] == 2
    assert "certified" not in c


def test_an_inbound_value_applies_once_however_often_it_is_submitted() -> None:
    h = Harness(B, "n1")
    h.state.apply(encode_command(Put(key="bal/y", value=b"100")))
    value = credit_value("bal/y", 25, "t1")
    st = SendStatement(src_cluster=A, dst_cluster=B, epoch=0, seq=0,
                       digest=value_digest(value))
    cert = certify(RAFT, st, [crypto(qualify("n1", A)), crypto(qualify("n2", A))],
                   leader=crypto(qualify("n1", A)))
    receiver = h.service.machine
    # Send it to whichever B member attempt 0 pairs with us; deliver to the right one.
    h.service.receive(qualify("n1", A), CsSend(attempt=0, value=value, certificate=cert))
    if not h.submitted:  # we are not attempt 0's receiver: an echo delivers it too
        h.service.receive(qualify("n2", B), CsEcho(value=value, certificate=cert))
    assert len(h.submitted) == 1
    assert receiver.status()["delivered"] == 1
    for _ in range(3):  # resubmitted until the state shows it
        h.service.tick()
    assert len(h.submitted) == 2
    for command in h.submitted * 2:  # every copy applied (as if 4 members submitted it)
        h.state.apply(command)
    assert h.state.get(f"cs/in/{A}/{0:010d}") == value
    assert h.state.get("bal/y") == b"125"  # credited once
    h.service.tick()
    assert h.service.counters()["applied"] == 1
    assert h.service.gauges()["inbox_pending"] == 0


def _certified(seq: int, value: bytes) -> tuple[SendStatement, Certificate]:
    st = SendStatement(src_cluster=A, dst_cluster=B, epoch=0, seq=seq,
                       digest=value_digest(value))
    return st, certify(RAFT, st, [crypto(qualify("n1", A)), crypto(qualify("n2", A))],
                       leader=crypto(qualify("n1", A)))


def test_a_restarted_receiver_resumes_after_what_its_state_holds() -> None:
    # The replicated state already holds A's values 0..2 (applied before this member
    # restarted with a fresh machine): value 3 is delivered at once, not held for 0..2.
    h = Harness(B, "n1")
    for seq in range(3):
        _, cert = _certified(seq, b"old")
        h.state.apply(delivery_command(Inbound(src_cluster=A, seq=seq, value=b"old",
                                               certificate=cert)))
        assert h.state.get(f"cs/in/{A}/{seq:010d}") == b"old"
    h.service.tick()
    _, cert = _certified(3, b"new")
    h.service.receive(qualify("n2", B), CsEcho(value=b"new", certificate=cert))
    assert len(h.submitted) == 1
    assert h.service.machine.status()["delivered"] == 1
    # An old value arriving again (a restarted sender re-sends it) is not delivered again.
    _, cert0 = _certified(0, b"old")
    h.service.receive(qualify("n3", B), CsEcho(value=b"old", certificate=cert0))
    assert len(h.submitted) == 1


def test_with_gc_confirmed_slots_are_compacted_and_delivered_entries_pruned() -> None:
    # Sending side: n1 of the Raft cluster certifies value 0 (n2's signature), gets B's
    # f+1 acknowledgements back, and submits the compaction; applied, the slot is gone, the
    # service forgets it, and a restarted reader starts after it.
    h = Harness(A, "n1", gc=True)
    h.state.apply(outbox_command(B, 0, b"v0"))
    h.state.apply(outbox_command(B, 1, b"v1"))
    h.service.tick()
    for seq in (0, 1):
        st = h.service._sending[(B, seq)].statement
        h.service.receive(NodeId("n2"), _sign("n2", st))
    ack = AckStatement(src_cluster=A, dst_cluster=B, dst_epoch=0, seq=0,
                       digest=value_digest(b"v0"))
    proof = AckProof(statement=ack, signatures=tuple(
        MemberSignature(signer=m, sig=crypto(m).sign(ack)) for m in PBFT.members[:2]))
    h.service.receive(qualify("n1", B), CsConfirm(proof=proof))
    assert h.service.counters()["confirmed"] == 1
    h.submitted.clear()
    h.service.tick()
    assert len(h.submitted) == 1  # the compaction of slot 0 (slot 1 is not confirmed)
    for _ in range(2):  # a copy from another member: a no-op
        h.state.apply(h.submitted[0])
    assert h.state.get(f"cs/out/{B}/{0:010d}") is None
    assert h.state.get(f"cs/out/{B}/{1:010d}") == b"v1"
    h.service.tick()
    assert h.service.counters()["compacted"] == 1
    assert (B, 0) not in h.service._sending
    assert (B, 1) in h.service._sending
    assert h.service.mailbox.outbox_mark(B) == 1
    # Receiving side: with gc_batch 2, two delivered values are pruned; dedup still holds.
    r = Harness(B, "n1", gc=True)
    for seq in (0, 1):
        _, cert = _certified(seq, b"old")
        r.state.apply(delivery_command(Inbound(src_cluster=A, seq=seq, value=b"old",
                                               certificate=cert)))
    r.service.tick()
    prunes = [c for c in r.submitted if decode_command(c) == CsPrune(src_cluster=A, below=2)]
    assert len(prunes) == 1
    r.state.apply(prunes[0])
    assert r.state.get(f"cs/in/{A}/{0:010d}") is None
    assert r.service.mailbox.received(A, 1)
    assert not r.service.mailbox.received(A, 2)
    r.service.tick()
    assert r.service.counters()["submitted_prune"] == 1
