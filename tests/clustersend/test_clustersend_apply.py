"""The inbox is checked where it matters: when a write APPLIES, on every replica.

Four replicas of a PBFT receiving cluster B (each its own `KvStateMachine` with its own
`ApplyCheck`, built from the same link material) apply the same ordered commands, as
consensus would hand them whatever a Byzantine primary or client proposed. Checked: a forged
inbox write (a plain put/txn/delete/update under ``cs/in/``, a `CsDeliver` without a
certificate, with a certificate of the wrong cluster, of another slot, with too few
signatures, with a signature over another value) is refused on every replica, answered with a
typed error and counted; a certified value applies exactly once (its credit too); any
tampering with a certified delivery is refused (hypothesis). Deliberate-bug control: with
`APPLY_UNCHECKED` the forged writes land, and `forged_entries`, the detector the tests rely
on, reports them.
"""

from __future__ import annotations

import dataclasses

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_inbox import credit_value
from phalanx.apps.kv_types import (
    Add,
    Compare,
    CompareAndSet,
    CsDeliver,
    Delete,
    KvCommand,
    KvError,
    KvErrorCode,
    KvResult,
    Put,
    Scan,
    ScanResult,
    Txn,
    TxnResult,
)
from phalanx.apps.kv_wire import decode_result, encode_command
from phalanx.clustersend import CertKind, ClusterInfo, SendStatement, certify, value_digest
from phalanx.consensus.types import NodeId
from phalanx.net import wire
from phalanx.net.crypto import Ed25519Crypto
from phalanx.protocols.spec import FaultModel
from phalanx.services.clustersend_apply import APPLY_UNCHECKED, ApplyCheck
from phalanx.services.clustersend_node import CLUSTERSEND_SERVICE_MESSAGES
from phalanx.services.linked_keys import cluster_info

A, B, C = "clusterA", "clusterB", "clusterC"
NODES = ("n1", "n2", "n3", "n4")
SRC = cluster_info(A, NODES, FaultModel.BYZANTINE)  # PBFT 4, f=1: certificates need 3
DST = cluster_info(B, NODES, FaultModel.BYZANTINE)
OTHER = cluster_info(C, NODES, FaultModel.BYZANTINE)  # not linked with B
KEYS = {m: Ed25519PrivateKey.generate() for c in (SRC, DST, OTHER) for m in c.members}
wire.register_all(CLUSTERSEND_SERVICE_MESSAGES)


def crypto(me: NodeId) -> Ed25519Crypto:
    return Ed25519Crypto(me, private_key=KEYS[me], public_keys={
        m: k.public_key() for m, k in KEYS.items()}, mac_keys={})


def replicas(bugs: frozenset[str] = frozenset()) -> list[KvStateMachine]:
    """B's four replicas, each with the check its clustersend service installs at start."""
    out = []
    for member in DST.members:
        machine = KvStateMachine()
        machine.install_delivery_check(ApplyCheck(own=B, linked={A: SRC},
                                                  verifier=crypto(member), bugs=bugs))
        out.append(machine)
    return out


def apply_all(machines: list[KvStateMachine], command: object) -> KvResult:
    """Apply one ordered command on every replica; they must answer the same."""
    assert isinstance(command, KvCommand)
    data = encode_command(command)
    results = {m.apply(data) for m in machines}
    assert len(results) == 1, "replicas answered differently"
    return decode_result(results.pop())


def statement(seq: int, value: bytes, *, src: str = A, dst: str = B) -> SendStatement:
    return SendStatement(src_cluster=src, dst_cluster=dst, epoch=0, seq=seq,
                         digest=value_digest(value))


def cert_bytes(info: ClusterInfo, st: SendStatement, signers: int | None = None) -> bytes:
    cert = certify(info, st, [crypto(m) for m in info.members])
    if signers is not None:
        cert = type(cert)(kind=cert.kind, statement=st, signatures=cert.signatures[:signers])
    return wire.encode(cert)


def deliver(seq: int, value: bytes, certificate: bytes, src: str = A) -> CsDeliver:
    return CsDeliver(src_cluster=src, seq=seq, value=value, certificate=certificate)


def inbox(machine: KvStateMachine) -> dict[str, bytes]:
    result = machine.execute(Scan(prefix="cs/in/", limit=1000))
    assert isinstance(result, ScanResult)
    return dict(result.items)


def forged_entries(machines: list[KvStateMachine], certified: dict[str, bytes]
                   ) -> dict[str, bytes]:
    """Inbox entries at any replica that the sending cluster never certified (the detector:
    must be empty; the deliberate-bug control shows it is not blind)."""
    return {key: value for m in machines for key, value in inbox(m).items()
            if certified.get(key) != value}


def key(seq: int, src: str = A) -> str:
    return f"cs/in/{src}/{seq:010d}"


def forgeries() -> list[tuple[str, object, str]]:
    """(what, command, expected refusal) for slot 0 of A, value b"forged"."""
    v, w = b"forged", b"agreed"
    bad_sigs = wire.decode(cert_bytes(SRC, statement(0, w)))
    over_other_value = type(bad_sigs)(kind=CertKind.BYZANTINE, statement=statement(0, v),
                                      signatures=bad_sigs.signatures)
    return [
        ("plain put", Put(key=key(0), value=v), "reserved"),
        ("txn, failure branch", Txn(compares=(Compare(key="x", expected=b"?"),), success=(),
                                    failure=(Put(key=key(0), value=v),)), "reserved"),
        ("cas", CompareAndSet(key=key(0), expected=None, new=v), "reserved"),
        ("update", Add(key=key(0), amount=1), "reserved"),
        ("no certificate", deliver(0, v, b""), "malformed_certificate"),
        ("garbage certificate", deliver(0, v, b"\x93\x01\x02\x03"), "malformed_certificate"),
        ("the wrong cluster's certificate", deliver(0, v, cert_bytes(
            OTHER, statement(0, v, src=C))), "wrong_slot"),
        ("an unlinked cluster as source", deliver(0, v, cert_bytes(
            OTHER, statement(0, v, src=C)), src=C), "unknown_cluster"),
        ("our own cluster as source", deliver(0, v, cert_bytes(
            DST, statement(0, v, src=B, dst=A)), src=B), "unknown_cluster"),
        ("addressed to another cluster", deliver(0, v, cert_bytes(
            SRC, statement(0, v, dst=C))), "wrong_cluster"),
        ("another slot's certificate", deliver(0, v, cert_bytes(SRC, statement(1, v))),
         "wrong_slot"),
        ("too few signatures", deliver(0, v, cert_bytes(SRC, statement(0, v), signers=2)),
         "short_certificate"),
        ("a certificate of another value", deliver(0, v, cert_bytes(SRC, statement(0, w))),
         "digest_mismatch"),
        ("signatures over another value", deliver(0, v, wire.encode(over_other_value)),
         "bad_signature"),
        ("a valid certificate with an unsigned term set (found by the tampering property)",
         deliver(0, w, wire.encode(dataclasses.replace(bad_sigs, term=1))),
         "malformed_certificate"),
    ]


def test_every_forged_inbox_write_is_refused_at_apply_on_every_replica() -> None:
    machines = replicas()
    for what, command, reason in forgeries():
        result = apply_all(machines, command)
        assert isinstance(result, KvError), what
        if reason == "reserved":
            assert result.code is KvErrorCode.RESERVED_KEY, what
            assert "written only by certified cluster-sending commands" in result.message
        else:
            assert result.code is KvErrorCode.UNCERTIFIED, what
            assert f"({reason})" in result.message, (what, result.message)
    assert forged_entries(machines, {}) == {}
    for m in machines:  # counted by reason, identically everywhere
        assert m.refused == machines[0].refused
    assert machines[0].refused["reserved_key"] == 4
    assert machines[0].refused["uncertified:malformed_certificate"] == 3
    assert machines[0].refused["uncertified:short_certificate"] == 1
    # A plain delete under cs/in/ is refused too (after a real delivery: it cannot be undone).
    v = b"real"
    assert apply_all(machines, deliver(0, v, cert_bytes(SRC, statement(0, v)))) == TxnResult(
        succeeded=True, observed=(None,))
    refused = apply_all(machines, Delete(key=key(0)))
    assert isinstance(refused, KvError)
    assert refused.code is KvErrorCode.RESERVED_KEY
    assert all(m.get(key(0)) == v for m in machines)


def test_a_machine_without_links_refuses_every_delivery() -> None:
    bare = [KvStateMachine(), KvStateMachine()]
    result = apply_all(bare, deliver(0, b"v", cert_bytes(SRC, statement(0, b"v"))))
    assert isinstance(result, KvError)
    assert "(no_linked_cluster)" in result.message
    assert all(inbox(m) == {} for m in bare)


def test_a_certified_value_applies_once_with_its_credit() -> None:
    machines = replicas()
    apply_all(machines, Put(key="bal/y", value=b"100"))
    value = credit_value("bal/y", 25, "t1")
    good = deliver(0, value, cert_bytes(SRC, statement(0, value)))
    assert apply_all(machines, good) == TxnResult(succeeded=True, observed=(None,))
    for copy in (good, good, deliver(0, b"forged", b"")):  # later copies: no-ops
        assert apply_all(machines, copy) == TxnResult(succeeded=False, observed=(value,))
    assert all(m.get("bal/y") == b"125" and m.get(key(0)) == value for m in machines)
    # Credits are derived from the certified value only: a credit aimed at the reserved
    # prefix, or at a value that is not a number, records the entry and credits nothing.
    apply_all(machines, Put(key="name", value=b"alice"))
    outbox = f"cs/out/{A}/{0:010d}"  # nor into our outbox (it would send a value)
    for seq, v in ((1, credit_value(key(7), 5)), (2, credit_value("name", 5)),
                   (3, credit_value(outbox, 5))):
        assert apply_all(machines, deliver(seq, v, cert_bytes(SRC, statement(seq, v)))
                         ) == TxnResult(succeeded=True, observed=(None,))
    assert all(m.get(key(7)) is None and m.get("name") == b"alice" and m.get(outbox) is None
               for m in machines)
    assert forged_entries(machines, {key(0): value, key(1): credit_value(key(7), 5),
                                     key(2): credit_value("name", 5),
                                     key(3): credit_value(outbox, 5)}) == {}


def test_deliberate_bug_apply_unchecked_lands_forgeries_and_the_detector_sees_them() -> None:
    machines = replicas(frozenset({APPLY_UNCHECKED}))
    landed = 0
    for _, command, reason in forgeries():
        result = apply_all(machines, command)
        if reason != "reserved" and isinstance(result, TxnResult) and result.succeeded:
            landed += 1
    found = forged_entries(machines, {})
    # The first forgery of each slot took it (A's, and the unlinked C's and our own B's).
    assert landed == 3
    assert found == {key(0): b"forged", key(0, C): b"forged", key(0, B): b"forged"}


@settings(max_examples=60, deadline=None)
@given(field=st.sampled_from(["value", "seq", "src", "certificate"]),
       position=st.integers(min_value=0), flip=st.integers(min_value=1, max_value=255))
def test_any_tampering_with_a_certified_delivery_is_refused(field: str, position: int,
                                                            flip: int) -> None:
    good = deliver(3, b"certified value", cert_bytes(SRC, statement(3, b"certified value")))
    if field in ("value", "certificate"):
        raw = bytearray(getattr(good, field))
        raw[position % len(raw)] ^= flip
        bad = dataclasses.replace(good, **{field: bytes(raw)})
    elif field == "seq":
        bad = dataclasses.replace(good, seq=3 + flip)
    else:
        bad = dataclasses.replace(good, src_cluster=A + chr(ord("a") + flip % 26))
    machine = replicas()[0]
    result = decode_result(machine.apply(encode_command(bad)))
    assert isinstance(result, KvError), result
    assert result.code is KvErrorCode.UNCERTIFIED
    assert inbox(machine) == {}
    assert decode_result(machine.apply(encode_command(good))) == TxnResult(
        succeeded=True, observed=(None,))


def test_a_replica_without_the_link_refuses_alone_and_counts_it() -> None:
    # What docs/CLUSTER_SENDING.md says of misconfigured link files: the replica that lacks
    # the link refuses what the others apply, diverges in those keys (a faulty replica,
    # counted against f) and shows it in its refusal counters.
    linked, unlinked = replicas()[:3], KvStateMachine()
    command = encode_command(deliver(0, b"v", cert_bytes(SRC, statement(0, b"v"))))
    answers = {m.apply(command) for m in linked}
    assert len(answers) == 1
    assert decode_result(answers.pop()) == TxnResult(succeeded=True, observed=(None,))
    refused = decode_result(unlinked.apply(command))
    assert isinstance(refused, KvError)
    assert refused.code is KvErrorCode.UNCERTIFIED
    assert unlinked.refused == {"uncertified:no_linked_cluster": 1}
    assert [m.get(key(0)) for m in linked] == [b"v"] * 3
    assert unlinked.get(key(0)) is None


def test_an_outbox_slot_is_written_once() -> None:
    """Members sign an outbox slot's value when they apply it: a second value for the same
    slot would be a conflicting send of one seq, so nothing but an identical put (a retry)
    may write a slot that holds a value; the put-if-absent txn still just fails."""
    from phalanx.apps.kv_inbox import outbox_key

    machines = replicas()
    slot = outbox_key(B, 0)
    put_if_absent = Txn(compares=(Compare(key=slot, expected=None),),
                        success=(Put(key=slot, value=b"v1"),))
    assert apply_all(machines, put_if_absent) == TxnResult(succeeded=True, observed=(None,))
    retry = apply_all(machines, put_if_absent)  # the client's retry: the guard fails, no write
    assert retry == TxnResult(succeeded=False, observed=(b"v1",))
    assert not isinstance(apply_all(machines, Put(key=slot, value=b"v1")), KvError)
    rewrites = [Put(key=slot, value=b"v2"), Delete(key=slot),
                Txn(compares=(), success=(Put(key=slot, value=b"v2"),)),
                Txn(compares=(Compare(key=slot, expected=b"nope"),), success=(),
                    failure=(Delete(key=slot),))]
    for command in rewrites:
        result = apply_all(machines, command)
        assert isinstance(result, KvError), command
        assert result.code is KvErrorCode.RESERVED_KEY
    assert all(m.get(slot) == b"v1" for m in machines)
    # A free slot is written as before.
    assert not isinstance(apply_all(machines, Put(key=outbox_key(B, 1), value=b"w")), KvError)
