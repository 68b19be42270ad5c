"""The incremental log checks (`check_log_matching`, `check_committed_durable`) give the same
verdicts, at the same checks, as a full rescan by a fresh checker every time."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.consensus.types import ClientRequest, Entry, EntryKind
from phalanx.jepsen.sim.invariants import InvariantChecker, LogMirror

NODES = ("a", "b", "c")


def _entry(index: int, term: int, tag: int) -> Entry:
    request = ClientRequest(client_id=f"c{tag}", request_no=1, command=b"x")
    return Entry(index=index, term=term, kind=EntryKind.COMMAND, requests=(request,))


_op = st.one_of(
    st.tuples(st.just("append"), st.sampled_from(NODES), st.integers(1, 2), st.integers(0, 1)),
    st.tuples(st.just("copy"), st.sampled_from(NODES), st.sampled_from(NODES), st.integers(0, 6)),
    st.tuples(st.just("truncate"), st.sampled_from(NODES), st.integers(1, 4)),
    st.tuples(st.just("snapshot"), st.sampled_from(NODES), st.integers(0, 3)),
    st.tuples(st.just("restart"), st.sampled_from(NODES)),
    st.tuples(st.just("apply"), st.sampled_from(NODES), st.integers(1, 6)),
)


def _full_verdicts(
    applied: list[tuple[str, Entry]], logs: dict[str, LogMirror], at: int
) -> list[tuple[str, str]]:
    fresh = InvariantChecker()
    for node, entry in applied:
        fresh.observe_apply(node, entry, 0)
    fresh.violations.clear()  # state-machine-safety is not under test here
    fresh.check_log_matching(logs, at)
    fresh.check_committed_durable(logs, at, durable_window=4)
    return [(v.invariant, v.detail) for v in fresh.violations]


@settings(max_examples=600, deadline=None)
@given(st.lists(_op, min_size=1, max_size=60))
def test_incremental_checks_match_full_rescans(ops: list[tuple[object, ...]]) -> None:
    logs = {n: LogMirror() for n in NODES}
    checker = InvariantChecker()
    applied: list[tuple[str, Entry]] = []
    expected: list[tuple[str, str]] = []
    at = 0
    for op in ops:
        kind = op[0]
        if kind == "append":
            _, node, term, tag = op
            log = logs[str(node)]
            log.append([_entry(log.last_index() + 1, int(str(term)), int(str(tag)))])
        elif kind == "copy":  # follow another log: the usual way two logs share entries
            _, dst, src, upto = op
            log, other = logs[str(dst)], logs[str(src)]
            for index in range(log.last_index() + 1, int(str(upto)) + 1):
                entry = other.get(index)
                if entry is None:
                    break
                log.append([entry])
        elif kind == "truncate":
            logs[str(op[1])].truncate_from(int(str(op[2])))
        elif kind == "snapshot":
            log = logs[str(op[1])]
            index = min(log.last_index(), log.snapshot_index + int(str(op[2])))
            held = log.get(index)
            log.install_snapshot(index, held.term if held is not None else log.snapshot_term)
        elif kind == "restart":
            old = logs[str(op[1])]
            logs[str(op[1])] = LogMirror(
                snapshot_index=old.snapshot_index, snapshot_term=old.snapshot_term,
                entries=list(old.entries),
            )
        elif kind == "apply":
            entry = logs[str(op[1])].get(int(str(op[2])))
            if entry is not None and entry.index not in checker.applied:
                applied.append((str(op[1]), entry))
                checker.observe_apply(str(op[1]), entry, 0)
        if at % 2 == 0:  # check after every other op
            at += 1
            checker.check_log_matching(logs, at)
            checker.check_committed_durable(logs, at, durable_window=4)
            for verdict in _full_verdicts(applied, logs, at):
                if verdict not in expected:
                    expected.append(verdict)
            got = [(v.invariant, v.detail) for v in checker.violations]
            assert got == expected
        else:
            at += 1


def test_truncation_below_the_agreed_prefix_is_rescanned() -> None:
    a = LogMirror(entries=[_entry(1, 1, 0), _entry(2, 1, 0), _entry(3, 1, 0)])
    b = LogMirror(entries=[_entry(1, 1, 0), _entry(2, 1, 0), _entry(3, 1, 0)])
    checker = InvariantChecker()
    checker.check_log_matching({"a": a, "b": b}, 1)
    assert checker.ok
    b.truncate_from(2)  # b rewrites index 2 with the same term but other content
    b.append([_entry(2, 1, 1), _entry(3, 1, 0)])
    checker.check_log_matching({"a": a, "b": b}, 2)
    assert [v.invariant for v in checker.violations] == ["log-matching"]
    assert "index 2" in checker.violations[0].detail


def test_committed_durable_checks_each_new_applied_index() -> None:
    e1, e2, e3 = _entry(1, 1, 0), _entry(2, 1, 0), _entry(3, 1, 0)
    logs = {"a": LogMirror(entries=[e1, e2, e3]), "b": LogMirror(entries=[e1, e2]),
            "c": LogMirror()}
    checker = InvariantChecker()
    checker.observe_apply("a", e1, 0)
    checker.observe_apply("a", e2, 0)
    checker.check_committed_durable(logs, 1)
    assert checker.ok
    checker.observe_apply("a", e3, 0)  # held by a alone
    checker.check_committed_durable(logs, 2)
    assert [v.invariant for v in checker.violations] == ["committed-durable"]
    assert "[3@t1" in checker.violations[0].detail
    # A log that loses an entry is rescanned below the indices found held before.
    logs["b"].truncate_from(2)
    checker.check_committed_durable(logs, 3)
    assert any("[2@t1" in v.detail for v in checker.violations)
