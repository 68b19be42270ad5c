"""Checker results, their composition, the stats checker, and checking a history by workload.

Owns:
    * `CheckerResult`: one checker's verdict (``valid`` is True, False or ``"unknown"``) with
      JSON-able details; `merge_verdicts` composes verdicts Jepsen-style (false beats unknown
      beats true).
    * `check_stats(history, functions=...)`: Jepsen's stats checker. Every operation kind
      (``f``) that was invoked, and every kind in `functions`, must complete ``ok`` at least
      once, and there must be at least one client operation; otherwise the run is invalid,
      so a run where nothing worked (every op timed out, a kind never got through) cannot
      pass. Details: per-f counts of ok / fail / info (pending ops count as info).
    * `check_history(workload, history, ...)` -> `RunResult`: the workload's own checker(s)
      plus the stats checker, merged. Workloads: ``register`` (per-key linearizability,
      `phalanx.jepsen.linearizability`), ``bank`` (`phalanx.jepsen.bank`), ``set``
      (`phalanx.jepsen.sets`).

Must not import: the simulator, consensus cores, trio, the client, or anything doing I/O.
Checking is a pure function of the history (plus the linearizability time budget).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from phalanx.jepsen.history import FAIL, INFO, OK, History
from phalanx.jepsen.linearizability import (
    DEFAULT_TIME_LIMIT,
    UNKNOWN,
    CheckResult,
    Verdict,
    check,
    merge_verdicts,
)
from phalanx.jepsen.models import RegisterModel

__all__ = [
    "UNKNOWN",
    "WORKLOADS",
    "CheckerResult",
    "RunResult",
    "Verdict",
    "check_history",
    "check_stats",
    "merge_verdicts",
]

WORKLOADS: Final = ("bank", "register", "set")
"""The workloads `check_history` knows, sorted."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckerResult:
    """One checker's verdict.

    Attributes:
        checker: the checker's name (``linearizable``, ``bank``, ``set``, ``stats``).
        valid: True, False or ``"unknown"``.
        details: JSON-able details (plain dicts, lists, strings, numbers, bools, None).
    """

    checker: str
    valid: Verdict
    details: Mapping[str, object] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {"valid": self.valid, **self.details}


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """Every checker's verdict on one history, and their merge.

    `linearizability` keeps the register checker's full result (counterexamples per key) for
    reports; None for other workloads.
    """

    workload: str
    results: tuple[CheckerResult, ...]
    linearizability: CheckResult | None = None

    @property
    def valid(self) -> Verdict:
        return merge_verdicts(r.valid for r in self.results)

    def result(self, checker: str) -> CheckerResult | None:
        for r in self.results:
            if r.checker == checker:
                return r
        return None

    def to_json(self) -> dict[str, object]:
        """``{"valid", "workload", "checkers": {name: result}}``: each checker's document
        once (the register workload's used to be repeated at the top level as well)."""
        return {
            "valid": self.valid,
            "workload": self.workload,
            "checkers": {r.checker: r.to_json() for r in self.results},
        }

    def summary(self) -> list[str]:
        """A short plain-text verdict: one line per checker, then what is wrong."""
        word = {True: "valid", False: "INVALID"}
        lines = [f"{word.get(self.valid, 'UNKNOWN') if isinstance(self.valid, bool) else 'UNKNOWN'}"
                 f" ({self.workload})"]
        for r in self.results:
            verdict = word[r.valid] if isinstance(r.valid, bool) else "unknown"
            lines.append(f"  {r.checker}: {verdict}{_detail(r)}")
            lin = self.linearizability
            if r.checker == "linearizable" and lin is not None and lin.valid is not True:
                lines.extend("    " + line for line in lin.explain())
        return lines


def _detail(r: CheckerResult) -> str:
    """A few words on a checker's result (counts, the first problems)."""
    d = r.details
    if r.checker == "linearizable":
        parts = [f"{d.get('ops', 0)} ops on {d.get('keys', 0)} keys"]
        for label, field_ in (("not linearizable", "failing_keys"), ("unknown", "unknown_keys")):
            keys = d.get(field_)
            if isinstance(keys, list) and keys:
                parts.append(f"{label}: {', '.join(repr(k) for k in keys)}")
        return "; " + "; ".join(parts)
    if r.valid is True:
        return ""
    problems = [f"{k}: {json.dumps(v)[:200]}" for k, v in sorted(d.items())
                if v not in ([], {}, None, 0)]
    return "; " + "; ".join(problems[:4])


def check_stats(history: History, *, functions: Iterable[str] = ()) -> CheckerResult:
    """Jepsen's stats checker (module docstring). `functions` are kinds that must appear."""
    counts: dict[str, dict[str, int]] = {f: {OK: 0, FAIL: 0, INFO: 0} for f in functions}
    for pair in history.pairs:
        per = counts.setdefault(pair.invoke.f, {OK: 0, FAIL: 0, INFO: 0})
        per[pair.outcome] += 1
    never = sorted(f for f, c in counts.items() if c[OK] == 0)
    total = sum(sum(c.values()) for c in counts.values())
    problems: list[str] = []
    if not history.pairs:
        problems.append("no client operations")
    problems.extend(f"no {f!r} operation succeeded" for f in never)
    ok = sum(c[OK] for c in counts.values())
    return CheckerResult(
        checker="stats",
        valid=not problems,
        details={
            "count": total,
            "ok_count": ok,
            "fail_count": sum(c[FAIL] for c in counts.values()),
            "info_count": sum(c[INFO] for c in counts.values()),
            "by_f": {f: dict(counts[f]) for f in sorted(counts)},
            "never_ok": never,
            "problems": problems,
        },
    )


def check_history(
    workload: str,
    history: History,
    *,
    functions: Iterable[str] = (),
    stats: bool = True,
    time_limit: float | None = DEFAULT_TIME_LIMIT,
    step_limit: int | None = None,
    clock: Callable[[], float] = time.monotonic,
    bank_total: int | None = None,
    bank_accounts: Iterable[str] | None = None,
) -> RunResult:
    """Run `workload`'s checker(s) and (unless `stats` is False) the stats checker.

    Args:
        workload: one of `WORKLOADS`.
        functions: operation kinds that must have succeeded (the workload's mix).
        time_limit, step_limit, clock: the linearizability search budget (register only).
        bank_total, bank_accounts: what the bank checker expects; when None, taken from the
            history's ``init`` operation, else inferred (see `phalanx.jepsen.bank`).

    Raises:
        ValueError: an unknown workload (our misuse).
        HistoryError: an operation the workload cannot interpret (bad value shape).
    """
    results: list[CheckerResult] = []
    lin: CheckResult | None = None
    if workload == "register":
        lin = check(
            history, RegisterModel(), time_limit=time_limit, step_limit=step_limit, clock=clock
        )
        doc = lin.to_json()
        results.append(
            CheckerResult(
                checker="linearizable",
                valid=lin.valid,
                details={k: v for k, v in doc.items() if k not in ("valid", "workload")},
            )
        )
    elif workload == "bank":
        from phalanx.jepsen.bank import check_bank

        accounts = None if bank_accounts is None else tuple(bank_accounts)
        results.append(check_bank(history, total=bank_total, accounts=accounts))
    elif workload == "set":
        from phalanx.jepsen.sets import check_set

        results.append(check_set(history))
    else:
        raise ValueError(f"unknown workload {workload!r}; known: {', '.join(WORKLOADS)}")
    if stats:
        results.append(check_stats(history, functions=functions))
    return RunResult(workload=workload, results=tuple(results), linearizability=lin)
