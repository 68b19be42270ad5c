"""The history format: Op validation, JSON Lines round trips, pairing rules, the recorder."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import immutables
import pytest
from hypothesis import given
from hypothesis import strategies as st

from phalanx.jepsen.history import (
    INFO,
    NEMESIS,
    History,
    HistoryError,
    HistoryRecorder,
    Op,
    parse_history,
    read_history,
    value_from_json,
    value_to_json,
    write_history,
)


def _line(**fields: object) -> str:
    return json.dumps(fields)


def _lines(*objs: dict[str, object]) -> list[str]:
    return [json.dumps(o) for o in objs]


def test_round_trip_through_a_file(tmp_path: Path) -> None:
    rec = HistoryRecorder()
    rec.invoke(process=0, f="write", key="x", value=1, time=10, node=2)
    rec.nemesis(f="partition", value={"isolated": [1, 2]}, time=11)
    rec.invoke(process=1, f="cas", key="x", value=(None, 2), time=12)
    rec.complete(process=0, type="ok", time=13)
    rec.complete(process=1, type="info", time=14, error="timeout")
    rec.invoke(process=2, f="read", key=7, time=15)
    history = rec.history()
    path = tmp_path / "h.jsonl"
    write_history(path, history)
    again = read_history(path)
    assert again.ops == history.ops
    assert again.lines == (1, 2, 3, 4, 5, 6)
    first = json.loads(path.read_text().splitlines()[0])
    assert first == {
        "index": 0,
        "time": 10,
        "process": 0,
        "type": "invoke",
        "f": "write",
        "key": "x",
        "value": 1,
        "node": 2,
    }
    assert again.ops[1].value == immutables.Map({"isolated": (1, 2)})
    assert again.ops[2].value == (None, 2)


def test_pairing_by_process_with_pending_and_nemesis() -> None:
    rec = HistoryRecorder()
    w = rec.invoke(process=0, f="write", key="x", value=1, time=0)
    r = rec.invoke(process=1, f="read", key="x", time=1)
    rec.nemesis(f="kill", time=2)
    rec.complete(process=1, type="ok", value=1, time=3)
    history = rec.history()
    assert [p.invoke for p in history.pairs] == [w, r]
    assert history.pairs[0].completion is None
    assert history.pairs[0].outcome == INFO
    assert history.pairs[0].indeterminate
    assert history.pairs[1].outcome == "ok"
    assert history.pairs[1].completion is not None
    assert history.pairs[1].completion.value == 1
    assert [op.f for op in history.nemesis] == ["kill"]
    assert history.keys() == ("x",)


def test_recorder_echoes_the_invoke_value_and_keeps_node() -> None:
    rec = HistoryRecorder()
    rec.invoke(process="c1", f="cas", key="k", value=[1, 2], time=5, node=3)
    done = rec.complete(process="c1", type="ok", time=6)
    assert done.value == (1, 2)
    assert done.node == 3
    assert done.index == 1


def _misuse_double_invoke(rec: HistoryRecorder) -> None:
    rec.invoke(process=0, f="read", key="x", time=6)


def _misuse_complete_idle(rec: HistoryRecorder) -> None:
    rec.complete(process=1, type="ok", time=6)


def _misuse_reuse_after_info(rec: HistoryRecorder) -> None:
    rec.complete(process=0, type="info", time=6)
    rec.invoke(process=0, f="read", key="x", time=7)


def _misuse_time_backwards(rec: HistoryRecorder) -> None:
    rec.complete(process=0, type="ok", time=4)


def _misuse_bad_type(rec: HistoryRecorder) -> None:
    rec.complete(process=0, type="invoke", time=6)  # type: ignore[arg-type]


def _misuse_nemesis_invoke(rec: HistoryRecorder) -> None:
    rec.invoke(process=NEMESIS, f="kill", time=6)


@pytest.mark.parametrize(
    ("misuse", "match"),
    [
        (_misuse_double_invoke, "already has an outstanding op"),
        (_misuse_complete_idle, "no outstanding op"),
        (_misuse_reuse_after_info, "retired"),
        (_misuse_time_backwards, "time went backwards"),
        (_misuse_bad_type, "completion type"),
        (_misuse_nemesis_invoke, "nemesis"),
    ],
)
def test_recorder_misuse_raises(misuse: Callable[[HistoryRecorder], None], match: str) -> None:
    rec = HistoryRecorder()
    rec.invoke(process=0, f="read", key="x", time=5)
    with pytest.raises(HistoryError, match=match):
        misuse(rec)


def _ok_base() -> list[dict[str, object]]:
    return [
        {"index": 0, "time": 0, "process": 0, "type": "invoke", "f": "write", "key": 1, "value": 1},
        {"index": 1, "time": 1, "process": 0, "type": "ok", "f": "write", "key": 1, "value": 1},
    ]


@pytest.mark.parametrize(
    ("mutate", "line", "match"),
    [
        (lambda objs: objs[1].pop("type"), 2, "missing field 'type'"),
        (lambda objs: objs[1].update(type="done"), 2, "field 'type'"),
        (lambda objs: objs[0].update(time=1.5), 1, "field 'time'"),
        (lambda objs: objs[0].update(index=-1), 1, "field 'index'"),
        (lambda objs: objs[0].update(index=True), 1, "field 'index'"),
        (lambda objs: objs[0].update(process=[1]), 1, "field 'process'"),
        (lambda objs: objs[0].update(f=""), 1, "field 'f'"),
        (lambda objs: objs[0].update(key=[1]), 1, "field 'key'"),
        (lambda objs: objs[0].update(color="red"), 1, "unknown field"),
        (lambda objs: objs[1].update(index=0), 2, "field 'index' must increase"),
        (lambda objs: objs[1].update(time=-1), 2, "field 'time' went backwards"),
        (lambda objs: objs[1].update(f="read"), 2, "field 'f' of completion"),
        (lambda objs: objs[1].update(key=2), 2, "field 'key' of completion"),
        (lambda objs: objs[1].update(process=9), 2, "no outstanding invoke"),
        (lambda objs: objs[1].update(type="invoke"), 2, "outstanding"),
    ],
)
def test_malformed_lines_name_line_and_field(mutate: object, line: int, match: str) -> None:
    objs = _ok_base()
    mutate(objs)  # type: ignore[operator]
    with pytest.raises(HistoryError, match=match) as exc:
        parse_history(_lines(*objs))
    assert exc.value.line == line
    assert str(exc.value).startswith(f"line {line}:")


def test_invalid_json_and_blank_lines_keep_real_line_numbers() -> None:
    text = ["", _lines(*_ok_base())[0], "   ", "{not json"]
    with pytest.raises(HistoryError, match="invalid JSON") as exc:
        parse_history(text)
    assert exc.value.line == 4
    history = parse_history(["", *_lines(*_ok_base())])
    assert history.lines == (2, 3)
    assert history.line_of(history.ops[1]) == 3


def test_reusing_a_process_after_info_is_rejected() -> None:
    objs = [
        *_ok_base(),
        {"index": 2, "time": 2, "process": 0, "type": "invoke", "f": "read", "key": 1},
        {"index": 3, "time": 3, "process": 0, "type": "info", "f": "read", "key": 1},
        {"index": 4, "time": 4, "process": 0, "type": "invoke", "f": "read", "key": 1},
    ]
    with pytest.raises(HistoryError, match="fresh process id") as exc:
        parse_history(_lines(*objs))
    assert exc.value.line == 5


def test_nemesis_events_are_not_paired() -> None:
    objs = [
        {"index": 0, "time": 0, "process": NEMESIS, "type": "info", "f": "partition"},
        {"index": 1, "time": 1, "process": NEMESIS, "type": "info", "f": "partition"},
    ]
    history = parse_history(_lines(*objs))
    assert history.pairs == ()
    assert len(history.nemesis) == 2


def test_non_json_values_are_rejected() -> None:
    with pytest.raises(HistoryError, match="non-finite"):
        value_from_json(float("nan"))
    with pytest.raises(HistoryError, match="non-string object key"):
        value_from_json({1: 2})
    with pytest.raises(HistoryError, match="not a JSON value"):
        Op(index=0, time=0, process=0, type="invoke", f="write", value={1, 2})  # type: ignore[arg-type]


def test_op_normalises_lists_to_tuples() -> None:
    op = Op(index=0, time=0, process=0, type="invoke", f="cas", key="k", value=[None, [1]])  # type: ignore[arg-type]
    assert op.value == (None, (1,))
    hash(op)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=5)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)


@given(json_values)
def test_values_survive_json(raw: object) -> None:
    value = value_from_json(raw)
    hash(value)
    assert json.loads(json.dumps(value_to_json(value))) == raw


@given(st.lists(st.tuples(json_values, st.sampled_from(["ok", "fail", "info"])), max_size=8))
def test_recorded_histories_round_trip_through_jsonl(ops: list[tuple[object, str]]) -> None:
    rec = HistoryRecorder()
    for i, (value, outcome) in enumerate(ops):
        rec.invoke(process=i, f="write", key="k", value=value, time=2 * i)  # type: ignore[arg-type]
        rec.complete(process=i, type=outcome, time=2 * i + 1)  # type: ignore[arg-type]
    history = rec.history()
    lines = [json.dumps(op.to_json()) for op in history.ops]
    assert parse_history(lines).ops == history.ops
    assert History.of(history.ops).pairs == history.pairs
