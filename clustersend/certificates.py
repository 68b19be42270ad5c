"""Certificates and proofs: making them and verifying them with another cluster's public material.

Owns: `ClusterInfo` (a cluster's public material: id, configuration epoch, members, f, fault
model), `certify` (assemble a certificate from member signatures), `check_certificate` and
`check_proof` (verify; return a drop reason or None, never raise), and the quorum rules.

What each certificate proves (docs/CLUSTER_SENDING.md):
- `CertKind.BYZANTINE` (PBFT cluster, n >= 3f+1): 2f+1 distinct members signed the statement.
  Non-faulty members sign only statements their cluster committed, and at least f+1 of the
  2f+1 are non-faulty, so the sending cluster agreed to send this value as this seq to this
  cluster -- whatever up to f Byzantine members do.
- `CertKind.CRASH` (Raft cluster, n >= 2f+1): the leader of `term` signed a `CommitNotice`
  and a majority (n//2+1 distinct members, the leader among them or not) signed the
  statement. A member signs once the entry is committed in its log. This proves commit ONLY
  IF NO MEMBER IS BYZANTINE: then a majority holds the entry in `term` and Raft's leader
  completeness keeps it committed across any f crashes. A Byzantine leader can make honest
  followers sign an entry it never committed (it controls the commit index they learn), so
  against Byzantine members it proves nothing more than "these members signed".
- `AckProof`: f2+1 distinct receiving-cluster members signed "delivered and echoed"; at least
  one is non-faulty and echoed the value inside its cluster, so every non-faulty member will
  deliver it (under the receiving cluster's fault bound, f2 Byzantine or crashed members).

Invariants: verification uses only `ClusterInfo` and an injected `Verifier` that knows the
members' public keys; it never raises on any input (Byzantine input is normal input).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from phalanx.clustersend.messages import (
    AckProof,
    AckStatement,
    Certificate,
    CertKind,
    CommitNotice,
    MemberSignature,
    SendStatement,
)
from phalanx.consensus.crypto import Signer, Verifier
from phalanx.consensus.types import NodeId


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterInfo:
    """One cluster's public material, as another cluster trusts it (members' signing keys live
    in the injected `Verifier`). Our misuse (bad sizes) raises `ValueError`."""

    cluster_id: str
    members: tuple[NodeId, ...]
    f: int
    kind: CertKind = CertKind.BYZANTINE
    epoch: int = 0

    def __post_init__(self) -> None:
        n = len(self.members)
        if not self.cluster_id:
            raise ValueError("cluster_id must not be empty")
        if len(set(self.members)) != n:
            raise ValueError(f"cluster {self.cluster_id}: members must be distinct")
        need = 3 * self.f + 1 if self.kind == CertKind.BYZANTINE else 2 * self.f + 1
        if self.f < 0 or n < need:
            raise ValueError(f"cluster {self.cluster_id}: n={n} members cannot tolerate "
                             f"f={self.f} ({self.kind.name.lower()} needs n >= {need})")

    @property
    def n(self) -> int:
        return len(self.members)

    @property
    def cert_quorum(self) -> int:
        """Distinct member signatures a certificate needs: 2f+1 (Byzantine) or n//2+1 (crash)."""
        return 2 * self.f + 1 if self.kind == CertKind.BYZANTINE else self.n // 2 + 1

    @property
    def ack_quorum(self) -> int:
        """Distinct acknowledgements an `AckProof` needs: f+1 (one non-faulty member)."""
        return self.f + 1


def sign_as(signer: Signer, statement: SendStatement | AckStatement) -> MemberSignature:
    return MemberSignature(signer=signer.node_id, sig=signer.sign(statement))


def certify(info: ClusterInfo, statement: SendStatement, signers: Iterable[Signer], *,
            term: int = 0, leader: Signer | None = None) -> Certificate:
    """A certificate for `statement` from `signers` (the first `cert_quorum` are used) and, for
    a crash-fault cluster, `leader`'s commit notice of `term`. Raises `ValueError` when too few
    signers are given or a crash certificate lacks its leader (our misuse)."""
    sigs = tuple(sign_as(s, statement) for s in list(signers)[:info.cert_quorum])
    if len(sigs) < info.cert_quorum:
        raise ValueError(f"cluster {info.cluster_id}: {len(sigs)} signers, "
                         f"a certificate needs {info.cert_quorum}")
    if info.kind == CertKind.BYZANTINE:
        return Certificate(kind=info.kind, statement=statement, signatures=sigs)
    if leader is None:
        raise ValueError("a crash-fault certificate needs the leader's commit notice")
    notice = CommitNotice(statement=statement, term=term, leader=leader.node_id)
    return Certificate(kind=info.kind, statement=statement, signatures=sigs, term=term,
                       leader=leader.node_id, leader_sig=leader.sign(notice))


def _check_signatures(members: frozenset[NodeId], quorum: int, statement: object,
                      signatures: tuple[MemberSignature, ...], verifier: Verifier) -> str | None:
    if len(signatures) < quorum:
        return "short_certificate"
    seen: set[NodeId] = set()
    for s in signatures:
        if s.signer in seen:
            return "duplicate_signer"
        seen.add(s.signer)
        if s.signer not in members:
            return "signer_not_member"
    for s in signatures:  # the cheap checks first: a verification costs ~100 us
        if not verifier.verify(s.signer, statement, s.sig):
            return "bad_signature"
    return None


def check_certificate(cert: Certificate, *, value_digest: bytes, dst_cluster: str,
                      clusters: Mapping[str, ClusterInfo], verifier: Verifier) -> str | None:
    """None iff `cert` proves that its sending cluster agreed to send the value with
    `value_digest` to `dst_cluster`; otherwise the drop reason. Never raises."""
    st = cert.statement
    info = clusters.get(st.src_cluster)
    if info is None:
        return "unknown_cluster"
    if st.dst_cluster != dst_cluster or st.src_cluster == dst_cluster:
        return "wrong_cluster"
    if st.epoch != info.epoch:
        return "wrong_epoch"
    if st.digest != value_digest:
        return "digest_mismatch"
    if cert.kind != info.kind:
        return "wrong_kind"
    if cert.kind == CertKind.BYZANTINE and (cert.term or cert.leader or cert.leader_sig):
        return "malformed_certificate"  # unsigned fields a Byzantine certificate leaves empty
    members = frozenset(info.members)
    if info.kind == CertKind.CRASH:
        leader = NodeId(cert.leader)
        if leader not in members:
            return "leader_not_member"
        notice = CommitNotice(statement=st, term=cert.term, leader=leader)
        if not verifier.verify(leader, notice, cert.leader_sig):
            return "bad_leader_signature"
    return _check_signatures(members, info.cert_quorum, st, cert.signatures, verifier)


def check_proof(proof: AckProof, *, src_cluster: str, seq: int, value_digest: bytes,
                clusters: Mapping[str, ClusterInfo], verifier: Verifier) -> str | None:
    """None iff `proof` shows that the receiving cluster it names got our `seq`-th value (with
    `value_digest`); otherwise the drop reason. Never raises."""
    st = proof.statement
    info = clusters.get(st.dst_cluster)
    if info is None or st.dst_cluster == src_cluster:
        return "unknown_cluster"
    if st.src_cluster != src_cluster or st.seq != seq:
        return "wrong_cluster"
    if st.dst_epoch != info.epoch:
        return "wrong_epoch"
    if st.digest != value_digest:
        return "digest_mismatch"
    return _check_signatures(frozenset(info.members), info.ack_quorum, st, proof.signatures,
                             verifier)


def ack_statement(cert: Certificate, dst: ClusterInfo) -> AckStatement:
    st = cert.statement
    return AckStatement(src_cluster=st.src_cluster, dst_cluster=st.dst_cluster,
                        dst_epoch=dst.epoch, seq=st.seq, digest=st.digest)


__all__ = ["ClusterInfo", "ack_statement", "certify", "check_certificate", "check_proof",
           "sign_as"]
