"""Deliberate leaderless bugs, for mutation tests: the simulator sweep and `test_gaps.py`
switch one on to prove their checkers catch it.

Owns: `BUG_NAMES` (the names `LeaderlessCore(..., bugs=...)` accepts) and `check_bugs`.
Only `core.py` and the flows it composes read the switches; `safety.py` states the honest
protocol (the `endorse_despite_conflict` switch bypasses its conflict check explicitly).

- ``drop_on_commit``: the reference's behaviour: committing T drops every pending
  transaction with an endorsement conditioned on T (gap 1: replicas diverge).
- ``no_version_gate``: release a committed transaction at once, without waiting for the
  applied versions to equal its requirements (gap 2).
- ``endorse_despite_conflict``: endorse unconditionally even when a conflicting pending
  transaction was endorsed (two conflicting transactions can both commit).
- ``skip_requirements``: endorse although a requirement does not match the applied
  version (the requirement check forgotten: a stale versioned write commits, and then
  waits at the version gate forever, or applies over a newer value without the gate).
- ``count_conditional``: count a conditional endorsement towards commit before its
  conditions are dropped (the commit rule's "definitely valid" forgotten: a transaction
  and the one its endorsement was conditioned on can both commit).
- ``ordered_one_close``: `stuck_resolution = "pbft"` decides on n-f votes and ONE ordered
  close (the rule as first stated): a Byzantine node's immediate close then decides before
  a slow correct committer's vote is ordered (DROP meets a commit).
- ``ordered_drop_ambiguous``: `stuck_resolution = "pbft"` drops, on n-f votes and f+1
  closes, a transaction whose counted evidence plus the uncounted members could make a
  quorum (the rule before 2026-12-02): a committer killed past the close then sees its
  transaction dropped everywhere else (DROP meets a commit).
- ``ordered_decided_once``: `stuck_resolution = "pbft"` never checkpoints a transaction
  again once a checkpoint naming it decided (the rule before 2026-12-02 evening): one kept
  on endorsements that later died stays pending for ever (the bank wedge; liveness).
- ``veto_decided_once``: the veto mode never checkpoints an id again once a remembered
  checkpoint names it, even one kept on ANOTHER id's proof (the rule before 2026-12-02
  night): a stuck condition of the kept id stays pending for ever, with the kept id and
  what is conditioned on them (liveness; the 1 s-horizon "runaway" seeds 44 and 55).
- ``ordered_dead_evidence``: `stuck_resolution = "pbft"` votes carry endorsements whose
  condition committed at the voter (the rule before 2026-12-02 evening): every later round
  keeps such a transaction again (liveness).
- ``no_dead_abort``: no abort certificate from endorsements whose condition committed here
  (refusals only, the rule before 2026-12-03): a transaction a veto checkpoint kept while
  its conditional endorsements were still alive, whose condition then committed, stays
  pending for ever, and every transaction conflicting with it behind it (liveness; the
  veto-mode bank run of seed 4, `test_dead_abort.py`).
- ``veto_no_rounds``: the veto mode never checkpoints an id again once a remembered
  checkpoint kept it on its OWN proof (the rule before 2026-12-03, branch vetolive): one
  whose endorsements then stay unusable without reaching the dead-endorsement abort
  threshold (a Byzantine endorser's unconditional one among them) stays pending for ever,
  and every transaction conflicting with it behind it (liveness; `test_veto_rounds.py`).
- ``skip_checkpoint_digest``: install a fetched checkpoint without checking that its bytes
  hash to the descriptor f+1 peers agreed on (state transfer: a Byzantine server's forged
  state goes in).
- ``forget_undecided``: garbage-collect a pending (undecided) transaction once its
  deadline is older than the GC horizon, as before 2026-12-02: a node that commits it
  later (a pause, a skewed clock, a late quorum) applies what the others forgot (an
  acknowledged write lost, or replicas apart).
- ``refuse_behind_checkpoint``: refuse to install a verified checkpoint that lacks a
  writing transaction this node applied (the install rule before 2026-12-02) instead of
  applying that transaction again after the install: a node catching up under load applies
  new commits before its first install and then refuses every checkpoint (a livelock).
- ``drop_forgotten``: vote drop on a checkpoint id this node holds nothing of, whatever
  its deadline (the rule before 2026-12-02): a node that committed T and collected it past
  its GC horizon then completes a DROP of T at the nodes that still hold it pending (DROP
  meets a commit; `memory.py`).
- ``install_over_forgotten``: install a verified checkpoint whose transaction table lacks a
  transaction this node applied and no longer holds (the rule before 2026-12-02 evening,
  `state_transfer.py` coverage rule off): a committer down past its GC horizon installs
  the state of f+1 nodes that never applied its write, undoing an acknowledged write on
  every replica (`test_leaderless_install_rollback.py`, seed 87).
- ``no_overdue_transfer``: never ask for state transfer for a transaction still undecided
  past the GC horizon (the rule before 2026-12-02 evening): where its committers applied it
  and collected its certificate, it stays pending for good at the nodes that hold it (no
  checkpoint vote can keep it), and their replicas lack the write the others applied.
- ``no_stale_transfer``: a certified proof of a transaction past this node's GC horizon
  that it holds nothing of does not ask for state transfer (the rule before 2026-12-02
  night): a commit missed during a cut or a clock offset that, with the catch-up's delay,
  outlasted the horizon is never learnt (1 s-horizon seeds 31 and 33, `converge`).
- ``cascade_in_drain``: apply the DROPs of the checkpoints one drain decided one id at a
  time, each drop cascading at once into the commit of its dependents (the rule before
  2026-12-02, branch lldiverge): a dependent whose endorsements are conditioned on the
  dropped id commits although the same drain also decided the dependent's own checkpoint
  DROP, at a node that decided the condition's checkpoint first (DROP meets a commit; a
  long halves partition with hot keys, `phalanx.jepsen.sim.scenarios`). With it `blocked`
  also ends at a checkpoint's decision, as it did then (`old_unblock` of the veto and ordered
  machines): the hardening of 2026-12-03 would otherwise refuse the dependent's commit.
- ``no_state_transfer``: ignore the checkpoint format (no state transfer): a node away for
  longer than the GC horizon never catches up.

Invariant: the empty set is the protocol.
"""

from __future__ import annotations

from collections.abc import Iterable

BUG_NAMES: tuple[str, ...] = ("drop_on_commit", "no_version_gate", "endorse_despite_conflict",
                              "skip_requirements", "count_conditional", "ordered_one_close",
                              "ordered_drop_ambiguous", "skip_checkpoint_digest",
                              "no_state_transfer", "forget_undecided",
                              "refuse_behind_checkpoint", "drop_forgotten",
                              "ordered_decided_once", "ordered_dead_evidence",
                              "veto_decided_once", "install_over_forgotten",
                              "no_overdue_transfer", "no_stale_transfer",
                              "cascade_in_drain", "no_dead_abort", "veto_no_rounds")


def check_bugs(names: Iterable[str]) -> frozenset[str]:
    """`names` as a frozenset; an unknown name raises `ValueError` naming the known ones."""
    wanted = frozenset(names)
    unknown = sorted(wanted - frozenset(BUG_NAMES))
    if unknown:
        raise ValueError(f"unknown leaderless bug switch(es) {unknown}; known: {list(BUG_NAMES)}")
    return wanted
