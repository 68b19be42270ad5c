"""The block-certifier service's wire types and the rules its nodes and clients share.

Owns: the client-port operation types (chain app codec range, ids 471-474):
471 `CertificateQuery` -> 472 `CertificateAnswer` and 473 `CertificateFetch` -> 474
`CertificateBatch` (read-only role); `PEER_MESSAGES` (the peer types the service host
routes to the service: 466 `BlockSignature`, defined with the certificate in
`phalanx.apps.chain.certificate`, and 473/474, a node fetching certificates of heights it
lacks from a peer, `phalanx.services.block_cert_fetch`); `certificate_quorum` (the signatures a
certificate needs, from the protocol registry's fault model, never a protocol name) and
`node_public_keys` (node id -> raw Ed25519 key from config peers' ``signing_public_key``).

Rules: pure data and pure functions; no trio, clocks or I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from phalanx.apps.chain.certificate import (
    BlockCertificate,
    BlockSignature,
    byzantine_certificate_quorum,
    crash_certificate_quorum,
)
from phalanx.consensus.types import Message
from phalanx.ops.node_config import PeerConfig
from phalanx.protocols.spec import FaultModel


@dataclass(frozen=True, slots=True, kw_only=True)
class CertificateQuery(Message):
    """Ask a node for the block certificate it stored at `height` (0: its newest)."""

    height: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CertificateAnswer(Message):
    """A node's stored certificate at `height` (None: none stored or collected yet), the
    quorum it collected to, and its newest certified height."""

    height: int
    certificate: BlockCertificate | None
    quorum: int
    newest: int


MAX_FETCH = 32
"""Heights one `CertificateFetch` may name (a longer one is dropped as malformed)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CertificateFetch(Message):
    """Ask a node (a peer, or a client such as `phalanx chain export`) for the certificates
    it stored at `heights` (at most `MAX_FETCH`, each >= 1)."""

    heights: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class CertificateBatch(Message):
    """The certificates a node stored of the heights a `CertificateFetch` named (those it
    has, by height). The receiver verifies each one: the sender is not trusted."""

    certificates: tuple[BlockCertificate, ...]


BLOCK_CERT_API_MESSAGES: dict[int, type] = {471: CertificateQuery, 472: CertificateAnswer,
                                            473: CertificateFetch, 474: CertificateBatch}
PEER_MESSAGES: dict[int, type] = {466: BlockSignature, 473: CertificateFetch,
                                  474: CertificateBatch}


def certificate_quorum(fault_model: FaultModel, n: int) -> int:
    """Signatures a block certificate of an `n`-node cluster needs: n - f under Byzantine
    faults (2f+1 of 3f+1), a majority under crash faults (see
    `phalanx.apps.chain.certificate` for what each proves)."""
    if fault_model is FaultModel.BYZANTINE:
        return byzantine_certificate_quorum(n)
    return crash_certificate_quorum(n)


class MissingNodeKey(ValueError):
    """A node public key is missing or malformed (the message names the node)."""


def node_public_keys(members: Iterable[PeerConfig]) -> dict[str, bytes]:
    """Node id -> raw 32-byte Ed25519 public key from each member's ``signing_public_key``.
    Raises `MissingNodeKey` naming the first member without a valid one."""
    out: dict[str, bytes] = {}
    for m in members:
        text = m.signing_public_key
        try:
            raw = bytes.fromhex(text) if text is not None else b""
        except ValueError:
            raw = b""
        if len(raw) != 32:
            raise MissingNodeKey(f"node {m.id!r} has no valid signing_public_key")
        out[m.id] = raw
    return out
