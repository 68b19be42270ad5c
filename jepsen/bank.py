"""The bank checker: every read of all accounts is one consistent snapshot of a conserved total.

Owns the bank workload's history format and `check_bank`.

History format (Jepsen's bank test; account names are strings, balances integers):
    * ``init`` (key omitted): value ``{"<account>": balance, ...}``, the opening balances,
      written atomically (only if no account exists yet) before any transfer. Optional.
    * ``transfer``: value ``{"from": "<a>", "to": "<b>", "amount": n}``; ``ok`` echoes it;
      ``fail`` when the source lacked the funds or the retries ran out (certainly no effect).
    * ``read``: invoke value null; ``ok`` value ``{"<account>": balance, ...}``, every
      account at one instant (one atomic scan of the account prefix).

Checks (per ``ok`` read; ``fail``/``info`` reads carry no value and are skipped):
    * ``wrong-total``: the balances do not sum to the expected total (money created or
      destroyed, or a torn snapshot mixing states before and after a transfer);
    * ``negative``: some balance is below zero;
    * ``missing-accounts`` / ``unexpected-accounts``: the read's account set differs from the
      expected one.
    The expected total and accounts are, in order of preference: the caller's, the ``init``
    operation's value, or (total only) the first ``ok`` read's sum, reported as inferred. A
    read that sees no account at all before ``init`` certainly completed is not an error
    (the bank did not exist yet).
    Verdict: False if any read is bad, ``"unknown"`` if there was no ``ok`` read, else True.

Must not import: the simulator, consensus cores, trio, the client. Pure; deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import immutables

from phalanx.jepsen.checker import UNKNOWN, CheckerResult, Verdict
from phalanx.jepsen.history import OK, History, HistoryError, Op, Value, value_to_json

INIT: Final = "init"
TRANSFER: Final = "transfer"
READ: Final = "read"
FUNCTIONS: Final = (READ, TRANSFER)
"""Operation kinds the stats checker requires to have succeeded in a bank run."""
MAX_REPORTED: Final = 20
"""Bad reads listed in full in the result (all are counted)."""


def balances(value: Value, *, op: Op, line: int | None) -> dict[str, int]:
    """The ``{"account": balance}`` map of an init or read op; `HistoryError` if malformed."""
    if not isinstance(value, immutables.Map):
        raise HistoryError(
            f"bank {op.f} value must be an object of account -> balance, got {value!r}",
            line=line,
        )
    out: dict[str, int] = {}
    for account, balance in value.items():
        if not isinstance(balance, int) or isinstance(balance, bool):
            raise HistoryError(
                f"bank {op.f}: balance of account {account!r} must be an integer, got {balance!r}",
                line=line,
            )
        out[account] = balance
    return out


def check_bank(
    history: History,
    *,
    total: int | None = None,
    accounts: Sequence[str] | None = None,
) -> CheckerResult:
    """Check every ``ok`` read of a bank history (module docstring).

    Raises:
        HistoryError: an init or read value that is not an account -> integer map.
    """
    line_of = {op.index: line for op, line in zip(history.ops, history.lines, strict=True)}
    position = {op.index: pos for pos, op in enumerate(history.ops)}
    init_done_at: int | None = None  # file position of the first ok init's completion
    source = "caller" if total is not None else None
    for pair in history.pairs:
        if pair.invoke.f != INIT:
            continue
        opening = balances(pair.invoke.value, op=pair.invoke, line=line_of[pair.invoke.index])
        if total is None:
            total, source = sum(opening.values()), "init"
        if accounts is None:
            accounts = tuple(sorted(opening))
        if pair.completion is not None and pair.outcome == OK:
            at = position[pair.completion.index]
            init_done_at = at if init_done_at is None else min(init_done_at, at)
    expected_accounts = None if accounts is None else frozenset(accounts)

    reads: list[tuple[Op, Op, dict[str, int]]] = []  # (invoke, ok completion, balances)
    transfers = {"ok": 0, "fail": 0, "info": 0}
    for pair in history.pairs:
        if pair.invoke.f == TRANSFER:
            transfers[pair.outcome] += 1
        if pair.invoke.f != READ or pair.outcome != OK or pair.completion is None:
            continue
        done = pair.completion
        reads.append((pair.invoke, done, balances(done.value, op=done, line=line_of[done.index])))
    if total is None and reads:
        total, source = sum(reads[0][2].values()), "first read"

    bad: list[dict[str, object]] = []
    bad_count = 0
    kinds: dict[str, int] = {}
    for invoke, done, seen in reads:
        if not seen and (init_done_at is None or position[invoke.index] < init_done_at):
            continue  # before the bank existed
        problems: list[str] = []
        observed = sum(seen.values())
        if total is not None and observed != total:
            problems.append("wrong-total")
        negative = sorted(a for a, b in seen.items() if b < 0)
        if negative:
            problems.append("negative")
        missing: list[str] = []
        unexpected: list[str] = []
        if expected_accounts is not None:
            missing = sorted(expected_accounts.difference(seen))
            unexpected = sorted(set(seen).difference(expected_accounts))
            if missing:
                problems.append("missing-accounts")
            if unexpected:
                problems.append("unexpected-accounts")
        if not problems:
            continue
        bad_count += 1
        for kind in problems:
            kinds[kind] = kinds.get(kind, 0) + 1
        if len(bad) < MAX_REPORTED:
            entry: dict[str, object] = {
                "index": done.index,
                "line": line_of[done.index],
                "time": done.time,
                "process": done.process,
                "problems": problems,
                "total": observed,
                "balances": value_to_json(done.value),
            }
            if negative:
                entry["negative"] = negative
            if missing:
                entry["missing"] = missing
            if unexpected:
                entry["unexpected"] = unexpected
            bad.append(entry)

    valid: Verdict = False if kinds else (UNKNOWN if not reads else True)
    return CheckerResult(
        checker="bank",
        valid=valid,
        details={
            "total": total,
            "total_from": source,
            "accounts": None if accounts is None else list(accounts),
            "read_count": len(reads),
            "bad_read_count": bad_count,
            "bad_reads_by_kind": dict(sorted(kinds.items())),
            "bad_reads": bad,
            "transfers": transfers,
            **({"reason": "no ok read"} if not reads else {}),
        },
    )
