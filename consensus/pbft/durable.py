"""Incremental persistence of `PbftDurableState`: the delta between two records, and its replay.

Owns: `PbftDeltaRules`, the pure `diff(old, new)` / `apply(state, delta)` pair (over
`messages.PbftStateDelta`) that `phalanx.persistence.StateJournal` uses to append only what
changed in `Ready.core_state` instead of rewriting the whole record (under load the record
holds up to 2K prepared certificates with their batches: about a megabyte).

Must not import: storage, the codec, trio, clocks. Pure functions of their arguments.

Invariants:
- Exact replay: ``apply(old, diff(old, new)) == new`` for any two records whose votes are
  sorted by (kind, view, seq) with unique keys and whose prepared certificates are sorted by
  seq with unique seqs (what `PbftCore.durable_state` produces); a property test checks it.
- A delta is a function of the two records only (deterministic bytes for equal inputs).
- `apply` raises `ValueError` on a record or delta of the wrong type (disk from elsewhere);
  the journal turns that into a `StorageError`.
"""

from __future__ import annotations

from phalanx.consensus.pbft.messages import (
    PbftDurableState,
    PbftStateDelta,
    SafetyData,
    SignedVote,
)

_VoteKey = tuple[int, int, int]


def _vote_key(v: SignedVote) -> _VoteKey:
    return (int(v.kind), v.view, v.seq)


class PbftDeltaRules:
    """`diff`/`apply` for `PbftDurableState` (see the module docstring)."""

    __slots__ = ()

    def diff(self, old: object, new: object) -> PbftStateDelta | None:
        """The delta turning `old` into `new`; None when they are equal."""
        if not isinstance(old, PbftDurableState) or not isinstance(new, PbftDurableState):
            raise ValueError("PbftDeltaRules only diffs PbftDurableState records")
        if old is new or old == new:
            return None
        old_votes = {_vote_key(v): v for v in old.safety.votes}
        new_votes = new.safety.votes
        floor = new.safety.floor
        prune_votes = floor if all(v.seq > floor for v in new_votes) else -1
        new_keys = {_vote_key(v) for v in new_votes}
        dropped_votes: list[int] = []
        for key in sorted(old_votes):
            if key[2] > prune_votes and key not in new_keys:
                dropped_votes.extend(key)
        votes = tuple(
            v for v in new_votes if (o := old_votes.get(_vote_key(v))) is not v and o != v
        )
        old_prepared = {p.pre_prepare.seq: p for p in old.prepared}
        stable = new.stable_seq
        prune_prepared = (
            stable if all(p.pre_prepare.seq > stable for p in new.prepared) else -1
        )
        new_seqs = {p.pre_prepare.seq for p in new.prepared}
        dropped_prepared = tuple(
            s for s in sorted(old_prepared) if s > prune_prepared and s not in new_seqs
        )
        prepared = tuple(
            p
            for p in new.prepared
            if (q := old_prepared.get(p.pre_prepare.seq)) is not p and q != p
        )
        proof_same = old.stable_proof is new.stable_proof or old.stable_proof == new.stable_proof
        return PbftStateDelta(
            view=new.view,
            view_active=new.view_active,
            stable_seq=new.stable_seq,
            stable_digest=new.stable_digest,
            stable_proof=None if proof_same else new.stable_proof,
            safety_floor=floor,
            prune_votes_upto=prune_votes,
            dropped_votes=tuple(dropped_votes),
            votes=votes,
            prune_prepared_upto=prune_prepared,
            dropped_prepared=dropped_prepared,
            prepared=prepared,
            safety_early_view=new.safety.early_view,
        )

    def apply(self, state: object, delta: object) -> PbftDurableState:
        """`state` with `delta` replayed onto it."""
        if not isinstance(state, PbftDurableState) or not isinstance(delta, PbftStateDelta):
            raise ValueError(
                f"cannot replay a {type(delta).__name__} onto a {type(state).__name__}"
            )
        if len(delta.dropped_votes) % 3:
            raise ValueError("PbftStateDelta.dropped_votes is not a list of triples")
        votes = {
            _vote_key(v): v for v in state.safety.votes if v.seq > delta.prune_votes_upto
        }
        flat = delta.dropped_votes
        for i in range(0, len(flat), 3):
            votes.pop((flat[i], flat[i + 1], flat[i + 2]), None)
        for v in delta.votes:
            votes[_vote_key(v)] = v
        prepared = {
            p.pre_prepare.seq: p
            for p in state.prepared
            if p.pre_prepare.seq > delta.prune_prepared_upto
        }
        for seq in delta.dropped_prepared:
            prepared.pop(seq, None)
        for p in delta.prepared:
            prepared[p.pre_prepare.seq] = p
        return PbftDurableState(
            view=delta.view,
            view_active=delta.view_active,
            stable_seq=delta.stable_seq,
            stable_digest=delta.stable_digest,
            stable_proof=state.stable_proof if delta.stable_proof is None else delta.stable_proof,
            safety=SafetyData(
                floor=delta.safety_floor,
                votes=tuple(votes[k] for k in sorted(votes)),
                early_view=delta.safety_early_view,
            ),
            prepared=tuple(prepared[s] for s in sorted(prepared)),
        )


__all__ = ["PbftDeltaRules", "PbftStateDelta"]
