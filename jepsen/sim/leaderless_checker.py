"""The leaderless simulator's checker: what every honest replica applied, judged after
quiescence against what the clients issued and were told.

Owns: `ApplyLog` (filled by the recording state machine: per node and incarnation, each
applied command with the versions of its keys just before it applied) and `check(...)`,
a pure function returning the violations.

Checks (honest replicas only; Byzantine ones are not judged):
- **validity**: every applied command is one a client issued;
- **converge**: every honest replica's final state (every workload key) is identical;
- **order**: two conflicting commands (the app's conflict relation) applied in one order at
  one replica are applied in that order at every replica (and every incarnation; each
  stretch between two installs of a checkpoint is judged on its own: what the installed
  state lacks is applied again after it);
- **requirements**: every applied transaction's requirements held when it applied;
- **once**: no command applied twice by one replica incarnation between two installs of a
  checkpoint (an install replaces the state, so a transaction the checkpoint lacks is
  applied again after it; a double apply across a restart shows in the folds below);
- **outcomes**: a transaction with f+1 matching commit notices was applied (by an honest
  replica, so everywhere by converge); one with f+1 abort notices was applied nowhere;
- **folds**: a counter's final value is the sum of its committed adds (modulo 2**64), a set's
  members are its committed sadds minus its committed srems, a register holds the value of a
  committed put (or nothing if none committed): commuting updates converge under any order.
- **quiescence** (`quiescence`, judged by the run from the nodes' status; on by default,
  off with the sim knob `quiescence=0`): no honest node still holds a pending transaction
  whose deadline passed more than `delta_old_ms` + `QUIESCENCE_GRACE_MS` before the end.
  Past `delta_old_ms` a stuck transaction is checkpointed and the veto commits or drops it;
  one pending for good is a liveness bug (the control `veto_decided_once`). Judged per
  transaction (`leaderless_scope`, from the cores' `stuck` reports): excused, and named in
  the run's trace with the limit, is a transaction where a DROP cannot come
  (docs/LEADERLESS.md "Limits" 1: it needs the delivered votes of all n members): in an
  undecided checkpoint waiting for an honest node down or fenced at the end, for a liar
  down or whose drop votes are never delivered (`silent`, `forge_veto`:
  `VOTE_WITHHOLDING`), or for an honest node that abstains ("Forgotten commits", liveness
  cost (2); "Limits" 6 outside the horizon contract); or one endorsed on condition of an
  excused one, or of an id (held or not) in such a checkpoint (docs/LEADERLESS.md
  "Quiescence on by default").
- **decisions** (judged by the run, `leaderless_scope.disagreements`): no two honest nodes
  hold opposite decisions (committed, dropped) of one transaction that is not excused.

Rules: pure (no simulator, no clocks); the conflict relation is injected.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from phalanx.apps import kv_ops, kv_wire
from phalanx.apps.kv_types import Add, Put, SAdd, SRem
from phalanx.jepsen.sim.leaderless_workload import TxRecord

Versions = tuple[tuple[str, bytes, bytes], ...]
"""(key, full version, base version) read just before a command applied."""


@dataclass(slots=True)
class ApplyLog:
    """Every apply of every replica incarnation: `runs[(node, incarnation)]` is the list of
    (command, versions before) in apply order."""

    runs: dict[tuple[str, int], list[tuple[bytes, Versions]]] = field(default_factory=dict)
    installs: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    """Per incarnation, the length of its run at each checkpoint install (state replaced)."""

    def record(self, node: str, incarnation: int, command: bytes, before: Versions) -> None:
        self.runs.setdefault((node, incarnation), []).append((command, before))

    def installed(self, node: str, incarnation: int) -> None:
        self.installs.setdefault((node, incarnation), []).append(
            len(self.runs.get((node, incarnation), ())))

    def applied_by(self, nodes: Sequence[str]) -> set[bytes]:
        keep = set(nodes)
        return {c for (node, _), run in self.runs.items() if node in keep for c, _ in run}


MIXED_KEYS = frozenset({"x0", "y0"})
"""The workload's mixed keys (`WorkloadConfig.mixed_pct`): judged by convergence, order and
requirements, not by a fold."""

State = Mapping[str, bytes | None]
"""A replica's final value of every workload key."""

QUIESCENCE_GRACE_MS = 2_000
"""How long past `delta_old_ms` after its deadline a transaction may still be pending at
the end (checkpoint rounds, veto, re-sends; skewed clocks). Measured 2026-12-03: seeds 0-99
of `make sim-leaderless`'s crash-fault sweep end with no pending transaction older than
its `delta_old_ms`; `veto_decided_once` leaves three pending 4 s past it (seed 44 of the
1 s horizon)."""


def check(
    *,
    records: Sequence[TxRecord],
    log: ApplyLog,
    finals: Mapping[str, State],
    honest: Sequence[str],
    faults: int,
    conflicts: Callable[[bytes, bytes], bool],
    limit: int = 8,
) -> list[str]:
    """The violations (at most `limit` per check), see the module docstring."""
    out: list[str] = []
    by_command = {r.command: r for r in records}
    honest_runs = {k: v for k, v in log.runs.items() if k[0] in set(honest)}
    committed = log.applied_by(honest)

    def add(kind: str, problems: list[str]) -> None:
        out.extend(f"{kind}: {p}" for p in problems[:limit])
        if len(problems) > limit:
            out.append(f"{kind}: ... {len(problems) - limit} more")

    add("validity", [f"{node}#{inc} applied a command no client issued: {c[:40]!r}"
                     for (node, inc), run in sorted(honest_runs.items())
                     for c, _ in run if c not in by_command])
    add("converge", _converge(finals, honest))
    add("order", _order(honest_runs, conflicts, by_command, log.installs))
    add("requirements", _requirements(honest_runs, by_command))
    add("once", _once(honest_runs, by_command, log.installs))
    add("outcomes", _outcomes(records, committed, faults))
    add("folds", _folds(records, committed, finals, honest))
    return out


def quiescence(oldest_pending: Mapping[str, tuple[int, int]], *, now_ms: int,
               delta_old_ms: int) -> list[str]:
    """`oldest_pending[node]` = (pending count, earliest pending deadline in ms) at the end
    (`now_ms`), for the honest nodes up and unfenced: the `quiescence` violations."""
    settle = now_ms - delta_old_ms - QUIESCENCE_GRACE_MS
    return [f"quiescence: {node} holds {count} pending transaction(s), the oldest "
            f"{now_ms - oldest} ms past its deadline at the end (never committed or dropped)"
            for node, (count, oldest) in sorted(oldest_pending.items())
            if count and oldest <= settle]


def _name(command: bytes, by_command: Mapping[bytes, TxRecord]) -> str:
    record = by_command.get(command)
    return record.describe() if record is not None else repr(command[:24])


def _converge(finals: Mapping[str, State], honest: Sequence[str]) -> list[str]:
    nodes = [n for n in honest if n in finals]
    if not nodes:
        return []
    base = nodes[0]
    problems = []
    for other in nodes[1:]:
        keys = sorted(set(finals[base]) | set(finals[other]))
        differ = [k for k in keys if finals[base].get(k) != finals[other].get(k)]
        if differ:
            k = differ[0]
            problems.append(f"{base} and {other} differ on {len(differ)} key(s), e.g. {k}: "
                            f"{_show(finals[base].get(k))} vs {_show(finals[other].get(k))}")
    return problems


def _show(value: bytes | None) -> str:
    return "absent" if value is None else repr(value[:40])


def _segments(run: list[tuple[bytes, Versions]], cuts: Sequence[int]) -> list[list[bytes]]:
    """The commands of `run` split at its installs (each install replaced the state)."""
    bounds = [0, *sorted(c for c in set(cuts) if 0 < c < len(run)), len(run)]
    return [[c for c, _ in run[a:b]] for a, b in itertools.pairwise(bounds)]


def _order(runs: Mapping[tuple[str, int], list[tuple[bytes, Versions]]],
           conflicts: Callable[[bytes, bytes], bool],
           by_command: Mapping[bytes, TxRecord],
           installs: Mapping[tuple[str, int], list[int]]) -> list[str]:
    first_seen: dict[tuple[bytes, bytes], tuple[str, int]] = {}
    problems = []
    verdicts: dict[tuple[bytes, bytes], bool] = {}
    for where, seq in ((w, seg) for w, run in sorted(runs.items())
                       for seg in _segments(run, installs.get(w, ()))):
        by_key: dict[str, list[bytes]] = {}
        for c in seq:
            record = by_command.get(c)
            by_key.setdefault(record.key if record is not None else "", []).append(c)
        for cmds in by_key.values():
            for i, a in enumerate(cmds):
                for b in cmds[i + 1:]:
                    if a == b:
                        continue
                    pair = (min(a, b), max(a, b))
                    verdict = verdicts.get(pair)
                    if verdict is None:
                        verdict = verdicts[pair] = conflicts(a, b)
                    if not verdict:
                        continue
                    other = first_seen.get((b, a))
                    if other is not None:
                        problems.append(
                            f"{_name(a, by_command)} before {_name(b, by_command)} at "
                            f"{where[0]}#{where[1]}, the other way at {other[0]}#{other[1]}")
                    first_seen.setdefault((a, b), where)
    return problems


def _requirements(runs: Mapping[tuple[str, int], list[tuple[bytes, Versions]]],
                  by_command: Mapping[bytes, TxRecord]) -> list[str]:
    problems = []
    for (node, inc), run in sorted(runs.items()):
        for command, before in run:
            record = by_command.get(command)
            if record is None:
                continue
            full = {k: v for k, v, _ in before}
            bases = {k: b for k, _, b in before}
            for req in record.tx.requirements:
                seen = (bases if req.base else full).get(req.key, b"")
                if seen != req.version:
                    kind = "base version" if req.base else "version"
                    problems.append(
                        f"{node}#{inc} applied {record.describe()} with {req.key} at {kind} "
                        f"{seen.hex()[:8] or 'absent'}, required "
                        f"{req.version.hex()[:8] or 'absent'}")
    return problems


def _once(runs: Mapping[tuple[str, int], list[tuple[bytes, Versions]]],
          by_command: Mapping[bytes, TxRecord],
          installs: Mapping[tuple[str, int], list[int]]) -> list[str]:
    problems = []
    for (node, inc), run in sorted(runs.items()):
        seen: set[bytes] = set()
        resets = set(installs.get((node, inc), ()))
        for i, (command, _) in enumerate(run):
            if i in resets:
                seen.clear()  # an install replaced the state: what it lacks applies again
            if command in seen:
                problems.append(f"{node}#{inc} applied {_name(command, by_command)} twice")
            seen.add(command)
    return problems


def _outcomes(records: Sequence[TxRecord], committed: set[bytes], faults: int) -> list[str]:
    problems = []
    for r in records:
        commits = max((r.committed_by(res) for res in set(r.results.values())), default=0)
        aborts = len(r.aborted_by)
        applied = r.command in committed
        if aborts > faults and applied:
            problems.append(f"{r.describe()}: {aborts} abort notices, yet applied")
        if commits > faults and not applied:
            problems.append(f"{r.describe()}: {commits} matching commit notices, never applied "
                            "by an honest replica")
        if r.outcome == "ok" and not applied:
            problems.append(f"{r.describe()}: recorded ok, never applied")
    return problems


def _folds(records: Sequence[TxRecord], committed: set[bytes],
           finals: Mapping[str, State], honest: Sequence[str]) -> list[str]:
    nodes = [n for n in honest if n in finals]
    if not nodes:
        return []
    sums: dict[str, int] = {}
    added: dict[str, set[bytes]] = {}
    removed: dict[str, set[bytes]] = {}
    values: dict[str, set[bytes]] = {}
    for r in records:
        if r.key in MIXED_KEYS:
            continue  # no fold: puts, adds and muls (sadd, srem of one member) interleave
        cmd = kv_wire.decode_command(r.command)
        live = r.command in committed
        if isinstance(cmd, Add):
            sums.setdefault(cmd.key, 0)
            if live:
                sums[cmd.key] += cmd.amount
        elif isinstance(cmd, SAdd):
            members = added.setdefault(cmd.key, set())
            if live:
                members.add(cmd.member)
        elif isinstance(cmd, SRem):
            gone = removed.setdefault(cmd.key, set())
            if live:
                gone.add(cmd.member)
        elif isinstance(cmd, Put):
            chosen = values.setdefault(cmd.key, set())
            if live:
                chosen.add(cmd.value)
    problems = []
    for node in nodes:
        final = finals[node]
        for key, total in sorted(sums.items()):
            want = None if total == 0 and final.get(key) is None else kv_ops.encode_int(
                (total - kv_ops.INT64_MIN) % 2**64 + kv_ops.INT64_MIN)
            if final.get(key) != want:
                problems.append(f"{node}: counter {key} = {_show(final.get(key))}, the "
                                f"committed adds sum to {total}")
        for key in sorted(set(added) | set(removed)):
            want_set = added.get(key, set()) - removed.get(key, set())
            got = kv_ops.decode_set(final.get(key))
            if got is None or set(got) != want_set:
                problems.append(f"{node}: set {key} = {_show(final.get(key))}, committed "
                                f"sadds minus srems give {len(want_set)} member(s)")
        for key, chosen in sorted(values.items()):
            got_value = final.get(key)
            if (got_value is None and chosen) or (got_value is not None
                                                  and got_value not in chosen):
                problems.append(f"{node}: register {key} = {_show(got_value)}, not the value "
                                "of a committed put")
    return problems
