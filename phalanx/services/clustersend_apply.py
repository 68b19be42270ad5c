"""The receiving cluster's apply-time certificate check: what makes a forged inbox write inert.

Owns: `ApplyCheck` (the KV app's `DeliveryCheck` for `CsDeliver`, `phalanx.apps.kv_inbox`),
`delivery_command` (the `CsDeliver` a member submits for a delivered `Inbound`) and the
deliberate bug `APPLY_UNCHECKED`.

Every replica runs `ApplyCheck` when a `CsDeliver` APPLIES, so what a proposer orders
(a Byzantine PBFT primary, a member submitting as a client) cannot put an uncertified value in
the inbox: the certificate must decode, name exactly the command's (source cluster, seq), be
addressed to us, and verify (`check_certificate`: kind, quorum of distinct members, signatures
over the statement whose digest is the command's value) against the source cluster's public
material.

Invariants: the check's input is the command plus `own` (our cluster id) and `linked` (the
linked clusters' `ClusterInfo`s and members' public keys), which `build` loads once at start
from the cluster directory's static link files (`phalanx.services.linked_keys`): identical
link files give an identical, deterministic verdict on every replica. Our own cluster is never
a source (its members' keys are not consulted). The check never raises.
"""

from __future__ import annotations

from collections.abc import Mapping

from phalanx.apps.kv_types import CsDeliver
from phalanx.apps.kv_wire import encode_command
from phalanx.clustersend import Certificate, ClusterInfo, Inbound, check_certificate, value_digest
from phalanx.consensus.crypto import Verifier
from phalanx.net import wire
from phalanx.net.codec import DecodeError

APPLY_UNCHECKED = "apply_unchecked"
"""Deliberate bug: accept every `CsDeliver` without looking at its certificate (the forged
inbox write lands; tests/clustersend/test_clustersend_apply.py and the runtime test must
catch it)."""


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

    def __call__(self, cmd: CsDeliver) -> str | None:
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


def delivery_command(inbound: Inbound) -> bytes:
    """The KV command that records `inbound` in our inbox (checked, once, at apply)."""
    return encode_command(CsDeliver(src_cluster=inbound.src_cluster, seq=inbound.seq,
                                    value=inbound.value,
                                    certificate=wire.encode(inbound.certificate)))


__all__ = ["APPLY_UNCHECKED", "ApplyCheck", "delivery_command"]
