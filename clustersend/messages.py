"""Cluster-sending wire types: certificates, the PCS messages and what a receiving cluster orders.

Owns: the wire types of `phalanx.clustersend` and their stable codec ids `CLUSTERSEND_MESSAGES`
(600-629, in the "intercluster" range 600-699 of `phalanx.net.wire`). Register them with
``phalanx.net.wire.register_all(CLUSTERSEND_MESSAGES)``.

Must not import: `phalanx.net` (the codec registers these classes, not the reverse), trio,
clocks, random.

Who signs what (every signed object is a registered dataclass without a signature field, so
its canonical bytes are what a signature covers):
- `SendStatement` (sending cluster, receiving cluster, configuration epoch, sequence number,
  value digest): signed by members of the SENDING cluster; enough of them form a
  `Certificate` (`phalanx.clustersend.certificates` says how many and what each kind proves).
- `CommitNotice` (a statement, a term, a leader): signed by the leader of a crash-fault
  (Raft) sending cluster only.
- `AckStatement` ("the receiving cluster's member delivered and echoed this value"): signed
  by members of the RECEIVING cluster; f2+1 of them form the `AckProof` returned to the sender.

Invariants: every class is a frozen, slotted, keyword-only dataclass of ints, strs, bytes,
enums, tuples or nested registered dataclasses (canonical encoding); `__post_init__` rejects
shapes no correct node produces (negative numbers, digests that are not 32 bytes, oversized
signature lists), so the codec drops them as malformed.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass

from phalanx.consensus.types import Message, NodeId

DIGEST_BYTES = 32
MAX_SIGNATURES = 256
"""More signatures than any supported cluster has members: a larger list is malformed."""


def value_digest(value: bytes) -> bytes:
    """SHA-256 of a cluster-sent value (domain-separated)."""
    return hashlib.sha256(b"phalanx-clustersend-value\x00" + value).digest()


class CertKind(enum.IntEnum):
    """What a certificate is made of, by the sending cluster's fault model."""

    BYZANTINE = 0  # 2f+1 distinct member signatures over the statement (PBFT)
    CRASH = 1  # a leader-signed commit notice plus a majority of member signatures (Raft)


def _check(*, non_negative: dict[str, int], digest: bytes | None = None) -> None:
    for name, value in non_negative.items():
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    if digest is not None and len(digest) != DIGEST_BYTES:
        raise ValueError(f"digest of {len(digest)} bytes (want {DIGEST_BYTES})")


@dataclass(frozen=True, slots=True, kw_only=True)
class SendStatement(Message):
    """"Cluster `src_cluster` (configuration `epoch`) agreed to send the value with `digest`
    to `dst_cluster` as its `seq`-th value": what sending-cluster members sign."""

    src_cluster: str
    dst_cluster: str
    epoch: int
    seq: int
    digest: bytes

    def __post_init__(self) -> None:
        _check(non_negative={"epoch": self.epoch, "seq": self.seq}, digest=self.digest)


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitNotice(Message):
    """"As leader of `term` I committed the entry that says `statement`": what a crash-fault
    cluster's leader signs (its part of a CRASH certificate)."""

    statement: SendStatement
    term: int
    leader: NodeId

    def __post_init__(self) -> None:
        _check(non_negative={"term": self.term})


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberSignature(Message):
    """One member's signature over a statement (the statement is carried beside it)."""

    signer: NodeId
    sig: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Certificate(Message):
    """A statement and the sending cluster's signatures over it. For `CertKind.CRASH`,
    `term`, `leader` and `leader_sig` (over `CommitNotice(statement, term, leader)`) are set;
    for `CertKind.BYZANTINE` they stay empty."""

    kind: CertKind
    statement: SendStatement
    signatures: tuple[MemberSignature, ...]
    term: int = 0
    leader: str = ""
    leader_sig: bytes = b""

    def __post_init__(self) -> None:
        _check(non_negative={"term": self.term})
        if len(self.signatures) > MAX_SIGNATURES:
            raise ValueError(f"{len(self.signatures)} signatures (at most {MAX_SIGNATURES})")


@dataclass(frozen=True, slots=True, kw_only=True)
class AckStatement(Message):
    """"A member of `dst_cluster` (configuration `dst_epoch`) delivered and echoed the value
    with `digest` that `src_cluster` sent as `seq`": what receiving-cluster members sign."""

    src_cluster: str
    dst_cluster: str
    dst_epoch: int
    seq: int
    digest: bytes

    def __post_init__(self) -> None:
        _check(non_negative={"dst_epoch": self.dst_epoch, "seq": self.seq}, digest=self.digest)


@dataclass(frozen=True, slots=True, kw_only=True)
class AckProof(Message):
    """f2+1 distinct receiving-cluster signatures over one `AckStatement`: the proof that every
    non-faulty member of the receiving cluster will deliver the value."""

    statement: AckStatement
    signatures: tuple[MemberSignature, ...]

    def __post_init__(self) -> None:
        if len(self.signatures) > MAX_SIGNATURES:
            raise ValueError(f"{len(self.signatures)} signatures (at most {MAX_SIGNATURES})")


@dataclass(frozen=True, slots=True, kw_only=True)
class CsSend(Message):
    """Inter-cluster: attempt `attempt`'s sender hands the certified value to its receiver."""

    attempt: int
    value: bytes
    certificate: Certificate

    def __post_init__(self) -> None:
        _check(non_negative={"attempt": self.attempt})


@dataclass(frozen=True, slots=True, kw_only=True)
class CsEcho(Message):
    """Intra-cluster (receiving side): a member that delivered a certified value passes it on,
    so a Byzantine receiver cannot deliver it to part of its cluster only."""

    value: bytes
    certificate: Certificate


@dataclass(frozen=True, slots=True, kw_only=True)
class CsAck(Message):
    """Intra-cluster (receiving side): the sender's own signed acknowledgement."""

    statement: AckStatement
    signed: MemberSignature


@dataclass(frozen=True, slots=True, kw_only=True)
class CsConfirm(Message):
    """The proof of receipt: inter-cluster from a receiver to the sender, then intra-cluster
    from the sender to its cluster."""

    proof: AckProof


@dataclass(frozen=True, slots=True, kw_only=True)
class CsQuery(Message):
    """Intra-cluster (sending side): "I have no proof yet for our `seq`-th value to
    `dst_cluster`"; a member holding one answers with `CsConfirm` (a member that missed the
    relayed confirmation learns it in one round, not by its own next lucky attempt)."""

    dst_cluster: str
    seq: int

    def __post_init__(self) -> None:
        _check(non_negative={"seq": self.seq})


@dataclass(frozen=True, slots=True, kw_only=True)
class Inbound(Message):
    """What a receiving replica hands to its cluster's ordering: one certified value of
    `src_cluster`, its `seq`-th. The ordering orders each (src_cluster, seq) once."""

    src_cluster: str
    seq: int
    value: bytes
    certificate: Certificate

    def __post_init__(self) -> None:
        _check(non_negative={"seq": self.seq})


ClusterSendMessage = CsSend | CsEcho | CsAck | CsConfirm | CsQuery
"""The closed union of what one cluster-sending machine sends another."""

CLUSTERSEND_MESSAGES: dict[int, type] = {
    600: SendStatement,
    601: CommitNotice,
    602: MemberSignature,
    603: Certificate,
    604: AckStatement,
    605: AckProof,
    606: CsSend,
    607: CsEcho,
    608: CsAck,
    609: CsConfirm,
    610: Inbound,
    611: CsQuery,
}
"""Stable codec type ids (never renumber). Cluster-sending's others: 612 `CsSign`
(`phalanx.services.clustersend_node`), 613-615 the KV commands `CsDeliver`, `CsCompact`,
`CsPrune` (`phalanx.apps.kv_types`); 616-619 and 622-626 are free."""

__all__ = [
    "CLUSTERSEND_MESSAGES",
    "DIGEST_BYTES",
    "AckProof",
    "AckStatement",
    "CertKind",
    "Certificate",
    "ClusterSendMessage",
    "CommitNotice",
    "CsAck",
    "CsConfirm",
    "CsEcho",
    "CsQuery",
    "CsSend",
    "Inbound",
    "MemberSignature",
    "SendStatement",
    "value_digest",
]
