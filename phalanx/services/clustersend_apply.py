"""The receiving cluster's apply-time certificate check: what makes a forged inbox write inert.

Owns: `ApplyCheck` (the KV app's `DeliveryCheck`, `phalanx.apps.kv_inbox`: certificates of
`CsDeliver`, acknowledgement proofs of `CsCompact`), the commands a member submits
(`delivery_command` for a delivered `Inbound`, `compact_command` for a `Confirmed` send,
`prune_command`) and the deliberate bug `APPLY_UNCHECKED`.

Every replica runs `ApplyCheck` when a `CsDeliver` APPLIES, so what a proposer orders
(a Byzantine PBFT primary, a member submitting as a client) cannot put an uncertified value in
the inbox: the certificate must decode, name exactly the command's (source cluster, seq), be
addressed to us, and verify (`check_certificate`: kind, quorum of distinct members, signatures
over the statement whose digest is the command's value) against the source cluster's public
material. Likewise an outbox slot is compacted only with f+1 acknowledgements of exactly
that slot's value by the destination cluster's members (`check_proof`).

Invariants: the check's input is the command plus `own` (our cluster id) and `linked` (the
linked clusters' `ClusterInfo`s and members' public keys), which `build` loads once at start
from the cluster directory's static link files (`phalanx.services.linked_keys`): identical
link files give an identical, deterministic verdict on every replica. Our own cluster is never
a source (its members' keys are not consulted). The check never raises.
"""

from __future__ import annotations

from collections.abc import Mapping

from phalanx.apps.kv_types import CsCompact, CsDeliver, CsPrune
from phalanx.apps.kv_wire import encode_command
from phalanx.clustersend import (
    AckProof,
    Certificate,
    ClusterInfo,
    Confirmed,
    Inbound,
    check_certificate,
    check_proof,
    value_digest,
)
from phalanx.consensus.crypto import Verifier
from phalanx.net import wire
from phalanx.net.codec import DecodeError

APPLY_UNCHECKED = "apply_unchecked"
"""Deliberate bug: accept every `CsDeliver` and `CsCompact` without looking at its proof (the
forged inbox write lands; tests/clustersend/test_clustersend_apply.py and the runtime test
must catch it)."""


class ApplyCheck:
    """`DeliveryCheck`: None iff `cmd.certificate` proves linked cluster `cmd.src_cluster`
    agreed to send `cmd.value` to us as its `cmd.seq`-th value; else the reason."""

    def __init__(self, *, own: str, linked: Mapping[str, ClusterInfo], verifier: Verifier,
                 bugs: frozenset[str] = frozenset()) -> None:
        if own in linked:
            raise ValueError(f"cluster {own} cannot be linked with itself")
        unknown = bugs - {APPLY_UNCHECKED}
        if unknown:
            raise ValueError(f"unknown apply-check bugs: {sorted(unknown)}")
        self.own = own
        self.linked = dict(linked)
        self._verifier = verifier
        self._unchecked = APPLY_UNCHECKED in bugs

    def with_bugs(self, bugs: frozenset[str]) -> ApplyCheck:
        """The same check with deliberate `bugs` (tests)."""
        return ApplyCheck(own=self.own, linked=self.linked, verifier=self._verifier,
                          bugs=bugs)

    def certificate(self, cmd: CsDeliver) -> str | None:
        if self._unchecked:
            return None
        try:
            cert = wire.decode(cmd.certificate, expected=Certificate, canonical=True)
        except (DecodeError, ValueError, TypeError):
            return "malformed_certificate"
        st = cert.statement
        if st.src_cluster != cmd.src_cluster or st.seq != cmd.seq:
            return "wrong_slot"  # a certificate of another (cluster, seq)
        return check_certificate(cert, value_digest=value_digest(cmd.value),
                                 dst_cluster=self.own, clusters=self.linked,
                                 verifier=self._verifier)

    def ack_proof(self, cmd: CsCompact, value: bytes) -> str | None:
        """None iff `cmd.proof` holds f+1 valid acknowledgements by `cmd.dst_cluster`'s
        members of our `cmd.seq`-th value to it, `value`; else the reason."""
        if self._unchecked:
            return None
        try:
            proof = wire.decode(cmd.proof, expected=AckProof, canonical=True)
        except (DecodeError, ValueError, TypeError):
            return "malformed_proof"
        if proof.statement.dst_cluster != cmd.dst_cluster:
            return "wrong_slot"
        reason = check_proof(proof, src_cluster=self.own, seq=cmd.seq,
                             value_digest=value_digest(value), clusters=self.linked,
                             verifier=self._verifier)
        return None if reason is None else f"proof_{reason}"


def delivery_command(inbound: Inbound) -> bytes:
    """The KV command that records `inbound` in our inbox (checked, once, at apply)."""
    return encode_command(CsDeliver(src_cluster=inbound.src_cluster, seq=inbound.seq,
                                    value=inbound.value,
                                    certificate=wire.encode(inbound.certificate)))


def compact_command(confirmed: Confirmed) -> bytes:
    """The KV command that compacts our confirmed outbox slot (its proof checked at apply)."""
    return encode_command(CsCompact(dst_cluster=confirmed.dst_cluster, seq=confirmed.seq,
                                    proof=wire.encode(confirmed.proof)))


def prune_command(src_cluster: str, below: int) -> bytes:
    """The KV command that prunes `src_cluster`'s delivered inbox entries below `below`."""
    return encode_command(CsPrune(src_cluster=src_cluster, below=below))


__all__ = ["APPLY_UNCHECKED", "ApplyCheck", "compact_command", "delivery_command",
           "prune_command"]
