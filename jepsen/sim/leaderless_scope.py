"""The scope of the leaderless simulator's `quiescence` judgement, per transaction: which
transactions still pending at the end of a run are excused (they wait on a documented
limit), and the decisions the honest nodes must agree on.

Owns: `VOTE_WITHHOLDING`, `silent_voters` (the voters whose drop vote may never come, and
the limit that says so), `excuse` (the excused transactions, each with its reason and
limit) and `disagreements` (the `decisions` check).

How a transaction is excused (docs/LEADERLESS.md "Quiescence on by default"; the nodes'
`LeaderlessCore.stuck` reports say what each old pending transaction waits on):
- it sits in an undecided checkpoint (at some honest node) that waits for the vote of a
  voter in `silent` (an honest node down or fenced at the end, or in the veto mode a liar
  down or with a behaviour of `VOTE_WITHHOLDING`): a DROP needs the delivered votes of all
  n members ("Limits" 1);
- or for the vote of an honest node that remembers that checkpoint and has not voted in it:
  it abstains, holding nothing of an id past its GC horizon or a commit without a proof
  ("Forgotten commits", liveness cost (2); "Limits" 6 outside the horizon contract);
- or a held endorsement of it names as a condition an excused transaction, or one (held
  or not) in such a checkpoint: it waits for that decision; transitively.
Everything else still pending `delta_old_ms` + `QUIESCENCE_GRACE_MS` past its deadline is
a `quiescence` violation. A run with nothing excused is judged exactly as before.

Rules: pure functions of the reports (no simulator, no clocks); deterministic (nodes in
sorted order, reports in the cores' order).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from phalanx.consensus.leaderless.status import StuckReport, WaitingCheckpoint

VOTE_WITHHOLDING = frozenset({"silent", "forge_veto"})
"""Byzantine behaviours (`phalanx.jepsen.leaderless_byzantine`) under which the liar's drop
votes are never delivered: ``silent`` sends none, ``forge_veto`` turns each into a veto
carrying forged endorsements, which no correct node echoes (`forged_veto`). A checkpoint
waiting on such a liar's vote never decides DROP (docs/LEADERLESS.md "Limits" 1)."""

LIMIT_SILENT = "a DROP needs the delivered votes of all n members: docs/LEADERLESS.md \"Limits\" 1"
LIMIT_ABSTAINS = ("it holds nothing of an id past its GC horizon, or a commit without a proof: "
                  "docs/LEADERLESS.md \"Forgotten commits\", liveness cost (2), \"Limits\" 6")


def silent_voters(*, honest: tuple[str, ...], reporting: Mapping[str, object],
                  liars: Mapping[str, tuple[str, ...]], liars_up: Mapping[str, bool],
                  unanimous_drop: bool) -> dict[str, str]:
    """The voters whose drop vote may never come, each with why: the honest nodes that do
    not report (down or fenced at the end) and, in the veto mode (`unanimous_drop`; the
    pbft mode decides a DROP on n - f ordered votes, its liars are judged), every liar down
    or with a behaviour of `VOTE_WITHHOLDING`."""
    out = {n: f"{n} down or fenced at the end" for n in honest if n not in reporting}
    for liar, behaviours in sorted(liars.items() if unanimous_drop else ()):
        why = sorted(VOTE_WITHHOLDING & set(behaviours))
        if not liars_up.get(liar, False):
            why.append("down")
        if why:
            out[liar] = f"the liar {liar} ({'+'.join(why)}) whose drop votes never come"
    return out


def excuse(reports: Mapping[str, StuckReport], silent: Mapping[str, str]) -> dict[bytes, str]:
    """The excused transactions of the honest nodes' `reports` (see the module docstring),
    each with its reason and limit, in a deterministic order."""
    abstainers: dict[bytes, list[str]] = {}
    for node, report in sorted(reports.items()):
        for cid in report.unvoted:
            abstainers.setdefault(cid, []).append(node)
    blocked: dict[bytes, str] = {}  # ids in a checkpoint (at any node) waiting for a limit
    for node, report in sorted(reports.items()):
        for wc in report.undecided:
            why = _waits(wc, silent, abstainers)
            for t in wc.tx_ids if why else ():
                blocked.setdefault(t, f"in undecided checkpoint {wc.checkpoint[:3].hex()} "
                                      f"(at {node}), waiting for {why}")
    excused: dict[bytes, str] = {}
    for node, report in sorted(reports.items()):
        for tx in report.txs:
            if tx.tx_id not in excused and tx.tx_id in blocked:
                excused[tx.tx_id] = f"at {node}: {blocked[tx.tx_id]}"
    grew = True
    while grew:  # conditioned on an excused or blocked transaction, transitively
        grew = False
        for node, report in sorted(reports.items()):
            for tx in report.txs:
                cond = next((c for c in tx.conditions if c in excused or c in blocked), None)
                if tx.tx_id not in excused and cond is not None:
                    excused[tx.tx_id] = (
                        f"at {node}: endorsed on condition of {cond[:3].hex()} (it waits for "
                        "that decision), which is " + (
                            "excused" if cond in excused else blocked[cond]))
                    grew = True
    return excused


def _waits(wc: WaitingCheckpoint, silent: Mapping[str, str],
           abstainers: Mapping[bytes, list[str]]) -> str:
    for voter in wc.waiting_on:
        if voter in silent:
            return f"{silent[voter]} ({LIMIT_SILENT})"
        if voter in abstainers.get(wc.checkpoint, ()):
            return f"{voter}, which abstains ({LIMIT_ABSTAINS})"
    return ""


def unexcused(reports: Mapping[str, StuckReport], excused: Mapping[bytes, str]
              ) -> dict[str, tuple[int, int]]:
    """Per reporting node, (how many of its reported transactions are not excused, the
    earliest deadline among them; 0 when none): `leaderless_checker.quiescence`'s input."""
    out: dict[str, tuple[int, int]] = {}
    for node, report in sorted(reports.items()):
        left = [t.deadline_ms for t in report.txs if t.tx_id not in excused]
        out[node] = (len(left), min(left, default=0))
    return out


def disagreements(decided: Mapping[str, Mapping[bytes, bool]], excused: Mapping[bytes, str],
                  name: Callable[[bytes], str]) -> list[str]:
    """The `decisions` violations: two honest nodes holding opposite decisions (committed,
    dropped) of one transaction that is not excused. `decided[node]` maps each transaction
    id the node still holds a tombstone of to whether it committed."""
    nodes = sorted(decided)
    problems = []
    for i, a in enumerate(nodes):
        for b in nodes[i + 1:]:
            other = decided[b]
            for tx_id, committed in decided[a].items():
                theirs = other.get(tx_id)
                if theirs is not None and theirs != committed and tx_id not in excused:
                    verb = ("committed", "dropped")
                    problems.append(f"{a} {verb[not committed]} {name(tx_id)}, "
                                    f"{b} {verb[not theirs]} it")
    return problems
