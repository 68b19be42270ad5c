"""View-change validation and the NewView computation (Castro-Liskov §4.4, signature variant).

Owns: the checks of a `ViewChange` (its signature, its stable-checkpoint certificate, each
prepared certificate), the computation of the pre-prepares a new primary must re-issue (the
O set: for each seq between min-s and max-s, the batch of the highest-view prepared
certificate, or a null request), the digest a NewView names a ViewChange by, and the
verification of a received `NewView` (its header alone, then against the view changes it
names, by recomputing O). Pure functions of their arguments: no state, no I/O.
Must not import: the core, trio, clocks, random, `phalanx.net`.

Every check returns a drop reason (str) or None; peer input never raises here.
Invariant (safety): if a request committed at seq n in some view < v, then at least f+1
honest replicas among any 2f+1 view changes carry a prepared certificate for it at n, so O
re-issues it at n (Castro-Liskov TOCS Thm. 4.4).
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import Protocol

from phalanx.consensus.crypto import Hasher, Verifier, digest_of
from phalanx.consensus.pbft.checkpoint import StableCheckpoint
from phalanx.consensus.pbft.config import PbftConfig
from phalanx.consensus.pbft.messages import (
    Checkpoint,
    NewView,
    PreparedProof,
    PrePrepare,
    ViewChange,
    signed_part,
)
from phalanx.consensus.pbft.stamp import pp_digest_ok


class CheckCrypto(Verifier, Hasher, Protocol):
    """What this module needs from the injected crypto."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NewViewPlan:
    """What a NewView establishes: the stable checkpoint at min-s and the O set (unsigned)."""

    stable: StableCheckpoint
    pre_prepares: tuple[PrePrepare, ...]

    @property
    def max_seq(self) -> int:
        return self.pre_prepares[-1].seq if self.pre_prepares else self.stable.seq


def check_checkpoint_proof(
    config: PbftConfig, crypto: CheckCrypto, seq: int, proof: tuple[Checkpoint, ...]
) -> str | None:
    """A stable-checkpoint certificate: a quorum of distinct replicas' valid checkpoints for
    `seq`, all with one digest (empty at seq 0)."""
    if seq == 0:
        return None if not proof else "bad_checkpoint_proof"
    replicas = {c.replica for c in proof}
    if len(replicas) != len(proof) or len(proof) < config.quorum:
        return "bad_checkpoint_proof"
    if len({c.digest for c in proof}) != 1 or any(c.seq != seq for c in proof):
        return "bad_checkpoint_proof"
    if not replicas <= set(config.replicas):
        return "bad_checkpoint_proof"
    for c in proof:
        if not crypto.verify(c.replica, c, c.signature):
            return "bad_signature"
    return None


def check_prepared_proof(
    config: PbftConfig,
    crypto: CheckCrypto,
    proof: PreparedProof,
    *,
    new_view: int,
    low: int,
    known: Container[object] = frozenset(),
) -> str | None:
    """A prepared certificate from a view before `new_view` for a seq in (low, low + L].
    `known`: pre-prepares and prepares (whole, signature included) the caller verified
    before with the same crypto; their digest and signatures are not checked again."""
    pp = proof.pre_prepare
    if not pp.view < new_view or not low < pp.seq <= low + config.log_window:
        return "bad_prepared_proof"
    pp_known = pp in known
    if pp.replica != config.primary(pp.view) or not (pp_known or pp_digest_ok(crypto, pp)):
        return "bad_prepared_proof"
    backups = {p.replica for p in proof.prepares}
    if len(backups) != len(proof.prepares) or len(backups) < config.quorum - 1:
        return "bad_prepared_proof"
    if pp.replica in backups or not backups <= set(config.replicas):
        return "bad_prepared_proof"
    if any((p.view, p.seq, p.digest) != (pp.view, pp.seq, pp.digest) for p in proof.prepares):
        return "bad_prepared_proof"
    if not pp_known and not crypto.verify(pp.replica, signed_part(pp), pp.signature):
        return "bad_signature"
    for p in proof.prepares:
        if p not in known and not crypto.verify(p.replica, p, p.signature):
            return "bad_signature"
    return None


def check_view_change(
    config: PbftConfig,
    crypto: CheckCrypto,
    vc: ViewChange,
    *,
    known: Container[object] = frozenset(),
) -> str | None:
    """Whether `vc` is well formed and correctly signed (`known`: as `check_prepared_proof`'s;
    the certificates of the view changes of one view share most of their votes)."""
    if vc.replica not in config.replicas or vc.new_view < 1 or vc.stable_seq < 0:
        return "bad_view_change"
    if not crypto.verify(vc.replica, vc, vc.signature):
        return "bad_signature"
    reason = check_checkpoint_proof(config, crypto, vc.stable_seq, vc.checkpoint_proof)
    if reason is not None:
        return reason
    seqs = [p.pre_prepare.seq for p in vc.prepared_proofs]
    if len(set(seqs)) != len(seqs):
        return "bad_prepared_proof"
    for proof in vc.prepared_proofs:
        reason = check_prepared_proof(
            config, crypto, proof, new_view=vc.new_view, low=vc.stable_seq, known=known
        )
        if reason is not None:
            return reason
    return None


def compute_new_view(
    config: PbftConfig, crypto: Hasher, view: int, view_changes: tuple[ViewChange, ...]
) -> NewViewPlan:
    """The NewView content for `view` from (already checked) view changes (§4.4):
    min-s is the latest stable checkpoint among them; for each seq in (min-s, max-s], O
    re-issues the batch of the prepared certificate of the highest view, or a null request.
    """
    if not view_changes:
        raise ValueError("compute_new_view needs at least one view change")
    base = max(view_changes, key=lambda vc: (vc.stable_seq, vc.replica))
    stable = StableCheckpoint(
        seq=base.stable_seq,
        digest=base.checkpoint_proof[0].digest if base.checkpoint_proof else b"",
        proof=base.checkpoint_proof,
    )
    best: dict[int, PrePrepare] = {}
    for vc in view_changes:
        for proof in vc.prepared_proofs:
            pp = proof.pre_prepare
            if pp.seq <= stable.seq:
                continue
            old = best.get(pp.seq)
            if old is None or pp.view > old.view:
                best[pp.seq] = pp
    max_s = max(best, default=stable.seq)
    primary = config.primary(view)
    null_digest = digest_of(crypto, ())
    o_set: list[PrePrepare] = []
    for seq in range(stable.seq + 1, max_s + 1):
        chosen = best.get(seq)
        if chosen is None:
            o_set.append(
                PrePrepare(view=view, seq=seq, digest=null_digest, batch=(), replica=primary)
            )
        else:
            # The batch keeps its block stamp (its original proposer and timestamp): d covers it.
            o_set.append(
                PrePrepare(
                    view=view, seq=seq, digest=chosen.digest, batch=chosen.batch,
                    replica=primary, timestamp=chosen.timestamp, proposer=chosen.proposer,
                )
            )
    return NewViewPlan(stable=stable, pre_prepares=tuple(o_set))


def view_change_digest(crypto: Hasher, vc: ViewChange) -> bytes:
    """The digest a NewView names `vc` by: of its canonical encoding, signature included."""
    return digest_of(crypto, vc)


def check_new_view_header(config: PbftConfig, crypto: CheckCrypto, nv: NewView) -> str | None:
    """What can be checked of a NewView without its view changes: its sender is the primary
    of its view, its signature, and V names 2f+1 distinct replicas of the configuration."""
    primary = config.primary(nv.view)
    if nv.view < 1 or nv.replica != primary:
        return "bad_new_view"
    if not crypto.verify(primary, nv, nv.signature):
        return "bad_signature"
    senders = [ref.replica for ref in nv.view_changes]
    if len(set(senders)) != len(senders) or len(senders) < config.quorum:
        return "bad_new_view"
    if not set(senders) <= set(config.replicas):
        return "bad_new_view"
    return None


def resolve_view_changes(
    crypto: Hasher, nv: NewView, pool: tuple[ViewChange, ...]
) -> tuple[ViewChange, ...] | None:
    """The view changes `nv` names, in its order, found in `pool` by replica and digest
    (None: one is missing). For callers holding whole messages (tests, attack models)."""
    found = {
        (vc.replica, view_change_digest(crypto, vc)): vc for vc in pool
    }
    out = [found.get((ref.replica, ref.digest)) for ref in nv.view_changes]
    return None if any(vc is None for vc in out) else tuple(vc for vc in out if vc is not None)


def check_new_view(
    config: PbftConfig,
    crypto: CheckCrypto,
    nv: NewView,
    view_changes: tuple[ViewChange, ...],
    *,
    checked: bool = False,
) -> tuple[str | None, NewViewPlan | None]:
    """Verify a NewView against the view changes it names and recompute O; return (drop
    reason, None) or (None, plan). `view_changes[i]` must be the one whose digest
    `nv.view_changes[i]` names (the caller found it by that digest: `resolve_view_changes`,
    or `ViewChangeFlow`'s store). `checked`: the caller verified each of them already (on
    arrival, with the same crypto); they are not verified again."""
    reason = check_new_view_header(config, crypto, nv)
    if reason is not None:
        return reason, None
    if len(view_changes) != len(nv.view_changes):
        return "bad_new_view", None
    for ref, vc in zip(nv.view_changes, view_changes, strict=True):
        if vc.replica != ref.replica or vc.new_view != nv.view:
            return "bad_new_view", None
        if checked:
            continue
        reason = check_view_change(config, crypto, vc)
        if reason is not None:
            return reason, None
    plan = compute_new_view(config, crypto, nv.view, view_changes)
    primary = nv.replica
    if len(plan.pre_prepares) != len(nv.pre_prepares):
        return "bad_new_view", None
    for want, got in zip(plan.pre_prepares, nv.pre_prepares, strict=True):
        if want != PrePrepare(
            view=got.view, seq=got.seq, digest=got.digest, batch=got.batch,
            replica=got.replica, timestamp=got.timestamp, proposer=got.proposer,
        ):
            return "bad_new_view", None
        if not crypto.verify(primary, signed_part(got), got.signature):
            return "bad_signature", None
    return None, plan
