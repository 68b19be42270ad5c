"""Garbage collection of the outbox and inbox, checked at apply like the inbox itself.

Sending side (cluster A, PBFT 4): a confirmed outbox slot is compacted by `CsCompact` only
with f2+1 acknowledgements of exactly that slot's value by the receiving cluster B's members;
forged, short, misplaced and out-of-order proofs are refused on every replica; a compacted
slot cannot be written again (it would make A send a second value for a seq B already has).
Receiving side: `CsPrune` forgets delivered entries below a per-source mark and later copies
of those values stay no-ops (dedup holds, also under any mix of deliveries and prunes: a
hypothesis property); it refuses to skip an undelivered slot.
Deliberate-bug control: with `APPLY_UNCHECKED` a forged proof compacts a slot, and the
detector (`compacted_without_proof`) reports it.
"""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_inbox import credit_value
from phalanx.apps.kv_types import (
    CsCompact,
    CsDeliver,
    CsPrune,
    KvCommand,
    KvError,
    KvErrorCode,
    KvResult,
    Put,
    TxnResult,
)
from phalanx.apps.kv_wire import decode_result, encode_command
from phalanx.clustersend import (
    AckProof,
    AckStatement,
    SendStatement,
    certify,
    value_digest,
)
from phalanx.clustersend.certificates import sign_as
from phalanx.consensus.types import NodeId
from phalanx.net import wire
from phalanx.net.crypto import Ed25519Crypto
from phalanx.protocols.spec import FaultModel
from phalanx.services.clustersend_apply import APPLY_UNCHECKED, ApplyCheck
from phalanx.services.clustersend_node import CLUSTERSEND_SERVICE_MESSAGES, outbox_command
from phalanx.services.linked_keys import cluster_info

A, B = "clusterA", "clusterB"
NODES = ("n1", "n2", "n3", "n4")
CA = cluster_info(A, NODES, FaultModel.BYZANTINE)
CB = cluster_info(B, NODES, FaultModel.BYZANTINE)  # acks need f+1 = 2
KEYS = {m: Ed25519PrivateKey.generate() for c in (CA, CB) for m in c.members}
wire.register_all(CLUSTERSEND_SERVICE_MESSAGES)


def crypto(me: NodeId) -> Ed25519Crypto:
    return Ed25519Crypto(me, private_key=KEYS[me], public_keys={
        m: k.public_key() for m, k in KEYS.items()}, mac_keys={})


def replicas(own: str, bugs: frozenset[str] = frozenset()) -> list[KvStateMachine]:
    mine, other = (CA, CB) if own == A else (CB, CA)
    out = []
    for member in mine.members:
        machine = KvStateMachine()
        machine.install_delivery_check(ApplyCheck(own=own, linked={other.cluster_id: other},
                                                  verifier=crypto(member), bugs=bugs))
        out.append(machine)
    return out


def apply_all(machines: list[KvStateMachine], command: KvCommand | bytes) -> KvResult:
    data = command if isinstance(command, bytes) else encode_command(command)
    results = {m.apply(data) for m in machines}
    assert len(results) == 1, "replicas answered differently"
    return decode_result(results.pop())


def proof(seq: int, value: bytes, signers: int = 2, *, src: str = A) -> bytes:
    st = AckStatement(src_cluster=src, dst_cluster=B, dst_epoch=0, seq=seq,
                      digest=value_digest(value))
    sigs = tuple(sign_as(crypto(m), st) for m in CB.members[:signers])
    return wire.encode(AckProof(statement=st, signatures=sigs))


def refused(result: KvResult, code: KvErrorCode, reason: str) -> bool:
    return isinstance(result, KvError) and result.code is code and reason in result.message


def compacted_without_proof(machines: list[KvStateMachine], proven: set[int]) -> set[int]:
    """Outbox slots to B compacted at some replica without a valid proof given (the
    detector: must be empty)."""
    return {seq for m in machines for seq in range(4)
            if m.get(f"cs/out/{B}/{seq:010d}") is None and seq < int(
                m.get(f"cs/mark/out/{B}") or b"0") and seq not in proven}


def test_an_outbox_slot_is_compacted_only_with_a_valid_ack_proof() -> None:
    machines = replicas(A)
    for seq in range(3):
        apply_all(machines, outbox_command(B, seq, f"v{seq}".encode()))
    forged = [
        (CsCompact(dst_cluster=B, seq=0, proof=b""), "(malformed_proof)"),
        (CsCompact(dst_cluster=B, seq=0, proof=proof(0, b"v0", signers=1)),
         "(proof_short_certificate)"),
        (CsCompact(dst_cluster=B, seq=0, proof=proof(0, b"other")), "(proof_digest_mismatch)"),
        (CsCompact(dst_cluster=B, seq=0, proof=proof(1, b"v1")), "(proof_wrong_cluster)"),
        (CsCompact(dst_cluster=B, seq=0, proof=proof(0, b"v0", src=B)),  # not our send
         "(proof_wrong_cluster)"),
    ]
    for command, reason in forged:
        assert refused(apply_all(machines, command), KvErrorCode.UNCERTIFIED, reason), reason
    out_of_order = apply_all(machines, CsCompact(dst_cluster=B, seq=1, proof=proof(1, b"v1")))
    assert refused(out_of_order, KvErrorCode.INVALID_ARGUMENT, "not the next slot")
    assert all(m.get(f"cs/out/{B}/{seq:010d}") == f"v{seq}".encode()
               for m in machines for seq in range(3))
    good = CsCompact(dst_cluster=B, seq=0, proof=proof(0, b"v0"))
    assert apply_all(machines, good) == TxnResult(succeeded=True, observed=(b"v0",))
    assert apply_all(machines, good) == TxnResult(succeeded=False, observed=(None,))
    assert apply_all(machines, CsCompact(dst_cluster=B, seq=1, proof=proof(1, b"v1"))
                     ) == TxnResult(succeeded=True, observed=(b"v1",))
    assert all(m.get(f"cs/out/{B}/{0:010d}") is None and m.get(f"cs/mark/out/{B}") == b"2"
               for m in machines)
    # A compacted slot cannot be filled again (nor the mark moved by hand); the next can.
    again = apply_all(machines, outbox_command(B, 0, b"second value"))
    assert refused(again, KvErrorCode.RESERVED_KEY, "compacted; the next free slot is 2")
    assert refused(apply_all(machines, Put(key=f"cs/mark/out/{B}", value=b"0")),
                   KvErrorCode.RESERVED_KEY, "cluster-sending commands")
    assert isinstance(apply_all(machines, outbox_command(B, 3, b"v3")), TxnResult)
    assert compacted_without_proof(machines, {0, 1}) == set()
    assert machines[0].refused["uncertified:proof_short_certificate"] == 1
    assert machines[0].refused["compact_not_next"] == 1


def test_deliberate_bug_apply_unchecked_compacts_with_a_forged_proof_and_is_caught() -> None:
    machines = replicas(A, frozenset({APPLY_UNCHECKED}))
    apply_all(machines, outbox_command(B, 0, b"v0"))
    apply_all(machines, CsCompact(dst_cluster=B, seq=0, proof=b"forged"))
    assert compacted_without_proof(machines, set()) == {0}


def certified(seq: int, value: bytes) -> CsDeliver:
    st = SendStatement(src_cluster=A, dst_cluster=B, epoch=0, seq=seq,
                       digest=value_digest(value))
    cert = certify(CA, st, [crypto(m) for m in CA.members])
    return CsDeliver(src_cluster=A, seq=seq, value=value, certificate=wire.encode(cert))


def test_pruning_the_inbox_keeps_dedup_and_skips_nothing() -> None:
    machines = replicas(B)
    for seq in (0, 1, 2, 4):
        assert apply_all(machines, certified(seq, f"v{seq}".encode())) == TxnResult(
            succeeded=True, observed=(None,))
    gap = apply_all(machines, CsPrune(src_cluster=A, below=5))
    assert refused(gap, KvErrorCode.INVALID_ARGUMENT, "slot 3 is not delivered yet")
    assert apply_all(machines, CsPrune(src_cluster=A, below=3)) == TxnResult(
        succeeded=True, observed=())
    assert all(m.get(f"cs/in/{A}/{seq:010d}") is None for m in machines for seq in range(3))
    assert all(m.get(f"cs/in/{A}/{4:010d}") == b"v4" for m in machines)
    # Exactly once still: a pruned value delivered again (a restarted sender) is a no-op.
    assert apply_all(machines, certified(1, b"v1")) == TxnResult(succeeded=False,
                                                                 observed=(None,))
    assert apply_all(machines, CsPrune(src_cluster=A, below=2)) == TxnResult(
        succeeded=False, observed=())
    assert all(m.get(f"cs/in/{A}/{1:010d}") is None for m in machines)
    assert refused(apply_all(machines, Put(key=f"cs/mark/in/{A}", value=b"9")),
                   KvErrorCode.RESERVED_KEY, "cluster-sending commands")


_CREDITS = [certified(seq, credit_value("bal", 1 << seq)) for seq in range(6)]
_ops = st.lists(st.one_of(st.tuples(st.just("deliver"), st.integers(0, 5)),
                          st.tuples(st.just("prune"), st.integers(0, 7))), max_size=25)


@settings(max_examples=50, deadline=None)
@given(ops=_ops)
def test_exactly_once_survives_any_mix_of_deliveries_and_prunes(
        ops: list[tuple[str, int]]) -> None:
    # Each seq credits a distinct power of two: the balance says exactly which values were
    # applied, and how often. Prunes and redeliveries in any order never apply one twice.
    m = replicas(B)[0]
    delivered: set[int] = set()
    for op, arg in ops:
        if op == "deliver":
            m.apply(encode_command(_CREDITS[arg]))
            delivered.add(arg)
        else:
            result = decode_result(m.apply(encode_command(CsPrune(src_cluster=A, below=arg))))
            mark = int(m.get(f"cs/mark/in/{A}") or b"0")
            if isinstance(result, TxnResult) and result.succeeded:
                assert set(range(arg)) <= delivered
                assert mark == arg
            assert all(m.get(f"cs/in/{A}/{seq:010d}") is None for seq in range(mark))
    assert int(m.get("bal") or b"0") == sum(1 << seq for seq in delivered)
