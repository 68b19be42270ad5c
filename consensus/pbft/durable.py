"""Incremental persistence of `PbftDurableState`: the delta between two records, and its replay.

Owns: `PbftDeltaRules`, the pure `diff(old, new)` / `apply(state, delta)` pair (over
`messages.PbftStateDelta`) that `phalanx.runtime.persistence.StateJournal` uses to append only what
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

from collections.abc import Callable
from typing import TypeVar

from phalanx.consensus.pbft.messages import (
    PbftDurableState,
    PbftStateDelta,
    PreparedProof,
    SafetyData,
    SignedVote,
)

_VoteKey = tuple[int, int, int]
_K = TypeVar("_K", _VoteKey, int)
_T = TypeVar("_T", SignedVote, PreparedProof)


def _vote_key(v: SignedVote) -> _VoteKey:
    return (int(v.kind), v.view, v.seq)


def _proof_key(p: PreparedProof) -> int:
    return p.pre_prepare.seq


def _merge(
    old: tuple[_T, ...], new: tuple[_T, ...], key: Callable[[_T], _K]
) -> tuple[list[_K], list[_T]]:
    """One walk over two sequences sorted by unique `key`: the keys only `old` has, and
    the items of `new` that `old` lacks or holds different. Items shared by both records
    (the usual case: one record is the next of the other) are skipped by identity, so a
    save costs about one comparison per item kept, whatever the window holds."""
    dropped: list[_K] = []
    changed: list[_T] = []
    i = j = 0
    n_old, n_new = len(old), len(new)
    while i < n_old and j < n_new:
        a, b = old[i], new[j]
        if a is b:
            i += 1
            j += 1
            continue
        ka, kb = key(a), key(b)
        if ka == kb:
            if a != b:
                changed.append(b)
            i += 1
            j += 1
        elif ka < kb:
            dropped.append(ka)
            i += 1
        else:
            changed.append(b)
            j += 1
    dropped.extend(key(a) for a in old[i:])
    changed.extend(new[j:])
    return dropped, changed


class PbftDeltaRules:
    """`diff`/`apply` for `PbftDurableState` (see the module docstring)."""

    __slots__ = ()

    def diff(self, old: object, new: object) -> PbftStateDelta | None:
        """The delta turning `old` into `new`; None when they are equal."""
        if not isinstance(old, PbftDurableState) or not isinstance(new, PbftDurableState):
            raise ValueError("PbftDeltaRules only diffs PbftDurableState records")
        if old is new or old == new:
            return None
        floor = new.safety.floor
        new_votes = new.safety.votes
        prune_votes = floor if all(v.seq > floor for v in new_votes) else -1
        dropped_keys, votes = _merge(old.safety.votes, new_votes, _vote_key)
        dropped_votes = [x for key in dropped_keys if key[2] > prune_votes for x in key]
        stable = new.stable_seq
        prune_prepared = (
            stable if all(p.pre_prepare.seq > stable for p in new.prepared) else -1
        )
        dropped_seqs, prepared = _merge(old.prepared, new.prepared, _proof_key)
        dropped_prepared = tuple(s for s in dropped_seqs if s > prune_prepared)
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
            votes=tuple(votes),
            prune_prepared_upto=prune_prepared,
            dropped_prepared=dropped_prepared,
            prepared=tuple(prepared),
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
