"""Certificates and proofs: honest ones verify with the sending cluster's public material only
(Ed25519 over the codec's canonical bytes, and FastCrypto); any tampering fails; forged, short,
duplicate-signer and wrong-cluster certificates are dropped by a receiver and counted by
reason; the wire types round-trip through the codec under their stable ids 600-611."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.clustersend.certificates import (
    ClusterInfo,
    ack_statement,
    certify,
    check_certificate,
    check_proof,
    sign_as,
)
from phalanx.clustersend.machine import ClusterSendMachine
from phalanx.clustersend.messages import (
    CLUSTERSEND_MESSAGES,
    AckProof,
    Certificate,
    CertKind,
    CsAck,
    CsConfirm,
    CsEcho,
    CsQuery,
    CsSend,
    Inbound,
    MemberSignature,
    SendStatement,
    value_digest,
)
from phalanx.clustersend.pairs import Mode, link_seed, schedule
from phalanx.consensus.core import Receive
from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.types import NodeId
from phalanx.net import wire
from phalanx.net.codec import Registry
from phalanx.net.crypto import ed25519_cluster

wire.register_all(CLUSTERSEND_MESSAGES)

A = ClusterInfo(cluster_id="A", members=tuple(NodeId(f"A/n{i}") for i in range(4)), f=1)
B = ClusterInfo(cluster_id="B", members=tuple(NodeId(f"B/n{i}") for i in range(4)), f=1)
R = ClusterInfo(cluster_id="R", members=tuple(NodeId(f"R/n{i}") for i in range(3)), f=1,
                kind=CertKind.CRASH)
CLUSTERS = {c.cluster_id: c for c in (A, B, R)}
ED = ed25519_cluster(A.members + B.members + R.members, seed=b"clustersend-test")
VALUE = b"transfer 5 from alice to bob"


def _statement(src: ClusterInfo = A, dst: str = "B", seq: int = 0,
               value: bytes = VALUE) -> SendStatement:
    return SendStatement(src_cluster=src.cluster_id, dst_cluster=dst, epoch=src.epoch, seq=seq,
                         digest=value_digest(value))


def _cert(src: ClusterInfo = A, **kw: object) -> Certificate:
    signers = [ED[m] for m in src.members]
    return certify(src, _statement(src, **kw), signers, term=3,  # type: ignore[arg-type]
                   leader=signers[0])


def _check(cert: Certificate, value: bytes = VALUE, dst: str = "B") -> str | None:
    return check_certificate(cert, value_digest=value_digest(value), dst_cluster=dst,
                             clusters=CLUSTERS, verifier=ED[B.members[0]])


def test_honest_certificates_verify_with_public_material_only() -> None:
    assert _check(_cert()) is None
    assert len(_cert().signatures) == 3  # 2f+1
    crash = _cert(R)
    assert crash.kind == CertKind.CRASH
    assert len(crash.signatures) == 2
    assert _check(crash) is None
    # A verifier that knows only B's own keys cannot check A's certificate.
    from phalanx.net.crypto import Ed25519Crypto
    b0 = ED[B.members[0]]
    only_b = ed25519_cluster(B.members, seed=b"other")[B.members[0]]
    assert isinstance(b0, Ed25519Crypto)
    assert check_certificate(_cert(), value_digest=value_digest(VALUE), dst_cluster="B",
                             clusters=CLUSTERS, verifier=only_b) == "bad_signature"


def test_certify_refuses_too_few_signers_and_a_crash_certificate_without_leader() -> None:
    with pytest.raises(ValueError, match="needs 3"):
        certify(A, _statement(), [ED[m] for m in A.members[:2]])
    with pytest.raises(ValueError, match="leader"):
        certify(R, _statement(R), [ED[m] for m in R.members])


def _tamper(cert: Certificate, how: str, data: st.DataObject) -> tuple[Certificate, bytes, str]:
    """A tampered certificate and the value and receiving cluster it is checked for."""
    s = cert.statement
    sigs = list(cert.signatures)
    value, dst = VALUE, "B"
    if how == "statement":
        field = data.draw(st.sampled_from(["src_cluster", "epoch", "seq", "digest"]))
        new = {"src_cluster": "R" if s.src_cluster == "A" else "A", "epoch": s.epoch + 1,
               "seq": s.seq + data.draw(st.integers(1, 9)),
               "digest": value_digest(b"other")}[field]
        return dataclasses.replace(cert, statement=dataclasses.replace(s, **{field: new})), \
            value, dst
    if how == "value":
        value = VALUE + data.draw(st.binary(min_size=1, max_size=4))
    elif how == "dst":
        dst = "R" if s.src_cluster == "A" else "A"
        return dataclasses.replace(
            cert, statement=dataclasses.replace(s, dst_cluster=dst)), value, "B"
    elif how == "flip":
        i = data.draw(st.integers(0, len(sigs) - 1))
        b = data.draw(st.integers(0, 63))
        raw = bytearray(sigs[i].sig)
        raw[b] ^= 1 << data.draw(st.integers(0, 7))
        sigs[i] = MemberSignature(signer=sigs[i].signer, sig=bytes(raw))
    elif how == "short":
        sigs = sigs[:-1]
    elif how == "duplicate":
        sigs[-1] = sigs[0]
    elif how == "rename":  # a signature claimed by another member
        i = data.draw(st.integers(0, len(sigs) - 1))
        src = CLUSTERS[s.src_cluster]
        unused = [m for m in src.members if m not in {x.signer for x in sigs}]
        sigs[i] = MemberSignature(signer=unused[0], sig=sigs[i].sig)
    elif how == "outsider":
        sigs[-1] = sign_as(ED[B.members[1]], s)
    elif how == "leader":
        return dataclasses.replace(cert, term=cert.term + 1), value, dst
    return dataclasses.replace(cert, signatures=tuple(sigs)), value, dst


@settings(max_examples=60, deadline=None)
@given(src=st.sampled_from(["A", "R"]),
       how=st.sampled_from(["statement", "value", "dst", "flip", "short", "duplicate",
                            "rename", "outsider", "leader"]),
       data=st.data())
def test_any_tampering_fails_verification(src: str, how: str, data: st.DataObject) -> None:
    if how == "leader" and src == "A":
        how = "flip"  # a Byzantine certificate has no leader notice
    cert = _cert(CLUSTERS[src])
    tampered, value, dst = _tamper(cert, how, data)
    assert _check(tampered, value, dst) is not None


def _receiver() -> ClusterSendMachine:
    return ClusterSendMachine(B.members[0], "B", CLUSTERS, crypto=ED[B.members[0]])


def _sender_for(cert: Certificate, attempt: int = 0) -> NodeId:
    s = cert.statement
    src = CLUSTERS[s.src_cluster]
    seed = link_seed(s.src_cluster, s.dst_cluster, s.epoch, s.seq)
    for a in range(attempt, attempt + 200):
        i, j = schedule(Mode.PCS, seed, a, src.n, B.n, src.f, B.f)[0]
        if B.members[j] == B.members[0]:
            return src.members[i]
    raise AssertionError("no attempt pairs B/n0")


def _attempt_for(cert: Certificate) -> int:
    s = cert.statement
    seed = link_seed(s.src_cluster, s.dst_cluster, s.epoch, s.seq)
    return next(a for a in range(200)
                if schedule(Mode.PCS, seed, a, A.n, B.n, A.f, B.f)[0][1] == 0)


@pytest.mark.parametrize(("how", "reason"), [
    ("short", "short_certificate"), ("duplicate", "duplicate_signer"),
    ("flip", "bad_signature"), ("outsider", "signer_not_member"),
    ("value", "digest_mismatch")])
def test_a_receiver_drops_forged_certificates_and_counts_them(how: str, reason: str) -> None:
    cert = _cert()
    sigs = list(cert.signatures)
    value = VALUE
    if how == "short":
        sigs = sigs[:2]
    elif how == "duplicate":
        sigs[2] = sigs[0]
    elif how == "flip":
        sigs[1] = MemberSignature(signer=sigs[1].signer, sig=bytes(64))
    elif how == "outsider":
        sigs[2] = sign_as(ED[R.members[0]], cert.statement)
    else:
        value = b"forged"
    forged = dataclasses.replace(cert, signatures=tuple(sigs))
    attempt = _attempt_for(cert)
    machine = _receiver()
    ready = machine.step(Receive(src=_sender_for(cert, attempt),
                                 message=CsSend(attempt=attempt, value=value,
                                                certificate=forged)))
    assert ready.deliver == ()
    assert ready.sends == ()
    assert machine.status()[f"dropped:{reason}"] == 1


def test_wrong_cluster_and_wrong_path_are_dropped() -> None:
    machine = _receiver()
    to_r = _cert(dst="R")
    ready = machine.step(Receive(src=A.members[0], message=CsSend(
        attempt=0, value=VALUE, certificate=to_r)))
    assert ready.deliver == ()
    assert machine.status()["dropped:wrong_cluster"] == 1
    # An echo may only come from inside the cluster; a CsSend only from outside.
    machine.step(Receive(src=A.members[0], message=CsEcho(value=VALUE, certificate=_cert())))
    machine.step(Receive(src=B.members[1], message=CsSend(attempt=0, value=VALUE,
                                                          certificate=_cert())))
    assert machine.status()["dropped:wrong_path"] == 2
    machine.step(Receive(src=NodeId("Z/n0"), message=CsQuery(dst_cluster="A", seq=0)))
    assert machine.status()["dropped:unknown_sender"] == 1


def test_proofs_need_f_plus_one_distinct_receiving_members() -> None:
    cert = _cert()
    ack = ack_statement(cert, B)
    sigs = tuple(sign_as(ED[m], ack) for m in B.members[:2])
    kw = dict(src_cluster="A", seq=0, value_digest=value_digest(VALUE), clusters=CLUSTERS,
              verifier=ED[A.members[0]])
    assert check_proof(AckProof(statement=ack, signatures=sigs), **kw) is None  # type: ignore[arg-type]
    assert check_proof(AckProof(statement=ack, signatures=sigs[:1]), **kw) \
        == "short_certificate"  # type: ignore[arg-type]
    assert check_proof(AckProof(statement=ack, signatures=(sigs[0], sigs[0])), **kw) \
        == "duplicate_signer"  # type: ignore[arg-type]
    other = dataclasses.replace(ack, seq=1)
    assert check_proof(AckProof(statement=other, signatures=sigs), **kw) \
        == "wrong_cluster"  # type: ignore[arg-type]


def test_wire_types_round_trip_under_their_stable_ids() -> None:
    registry = Registry()
    wire.register_all(CLUSTERSEND_MESSAGES, registry=registry)
    assert all(i in wire.RANGES["intercluster"] and i < 630 for i in CLUSTERSEND_MESSAGES)
    cert, crash = _cert(), _cert(R)
    ack = ack_statement(cert, B)
    signed = sign_as(ED[B.members[0]], ack)
    proof = AckProof(statement=ack, signatures=(signed,))
    for message in (CsSend(attempt=2, value=VALUE, certificate=cert),
                    CsSend(attempt=0, value=b"", certificate=crash),
                    CsEcho(value=VALUE, certificate=cert), CsAck(statement=ack, signed=signed),
                    CsConfirm(proof=proof), CsQuery(dst_cluster="B", seq=7),
                    Inbound(src_cluster="A", seq=0, value=VALUE, certificate=cert)):
        assert registry.decode(registry.encode(message)) == message
        assert wire.decode(wire.encode(message)) == message


def test_malformed_shapes_are_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="digest"):
        SendStatement(src_cluster="A", dst_cluster="B", epoch=0, seq=0, digest=b"short")
    with pytest.raises(ValueError, match="seq"):
        SendStatement(src_cluster="A", dst_cluster="B", epoch=0, seq=-1, digest=bytes(32))
    with pytest.raises(ValueError, match="cannot tolerate"):
        ClusterInfo(cluster_id="X", members=(NodeId("x0"), NodeId("x1"), NodeId("x2")), f=1)


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_arbitrary_peer_input_never_raises(data: st.DataObject) -> None:
    """Byzantine input is normal input: random mixes of real and mangled messages from any
    member are dropped and counted, never raised."""
    machine = ClusterSendMachine(B.members[0], "B", CLUSTERS,
                                 crypto=FastCrypto(B.members[0]))
    fast = {m: FastCrypto(m) for m in A.members + B.members}
    cert = certify(A, _statement(), [fast[m] for m in A.members])
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    ack = ack_statement(cert, B)
    for _ in range(data.draw(st.integers(1, 12))):
        src = data.draw(st.sampled_from(A.members + B.members))
        value = data.draw(st.sampled_from([VALUE, b"", rng.randbytes(8)]))
        seq = data.draw(st.integers(0, 3))
        mangled = dataclasses.replace(cert, statement=dataclasses.replace(cert.statement,
                                                                           seq=seq))
        c = data.draw(st.sampled_from([cert, mangled]))
        msg = data.draw(st.sampled_from([
            CsSend(attempt=data.draw(st.integers(0, 2**21)), value=value, certificate=c),
            CsEcho(value=value, certificate=c),
            CsAck(statement=ack, signed=MemberSignature(signer=src, sig=rng.randbytes(32))),
            CsAck(statement=ack, signed=sign_as(fast[src], ack)),
            CsConfirm(proof=AckProof(statement=ack, signatures=())),
            CsQuery(dst_cluster="A", seq=seq)]))
        machine.step(Receive(src=src, message=msg))
    assert all(v >= 0 for v in machine.status().values())
