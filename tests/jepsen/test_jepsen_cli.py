"""``phalanx jepsen check``: JSON verdict on stdout and exit codes 0/1/3/4 (2: usage)."""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from phalanx.jepsen.cli import (
    EXIT_BAD_HISTORY,
    EXIT_INVALID,
    EXIT_UNKNOWN,
    EXIT_VALID,
    add_jepsen_command,
)
from phalanx.jepsen.history import HistoryRecorder, write_history


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="phalanx")
    add_jepsen_command(parser.add_subparsers(dest="command"))
    return parser


def _run(argv: Sequence[str]) -> tuple[int, str, str]:
    args = _parser().parse_args(argv)
    out, err = io.StringIO(), io.StringIO()
    code = args.handler(args, stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def _write(path: Path, read_value: object, *, writers: int = 1) -> Path:
    rec = HistoryRecorder()
    t = 0
    for p in range(writers):
        rec.invoke(process=p, f="write", key="x", value=p + 1, time=t)
        t += 1
    if writers == 1:
        rec.complete(process=0, type="ok", time=t)
        t += 1
    rec.invoke(process=100, f="read", key="x", time=t)
    rec.complete(process=100, type="ok", value=read_value, time=t + 1)  # type: ignore[arg-type]
    write_history(path, rec.ops)
    return path


def test_valid_history_exits_0(tmp_path: Path) -> None:
    code, out, err = _run(["jepsen", "check", "--json", str(_write(tmp_path / "h.jsonl", 1))])
    assert code == EXIT_VALID == 0
    doc = json.loads(out)
    assert doc["valid"] is True
    assert doc["workload"] == "register"
    assert set(doc) == {"valid", "workload", "checkers", "seconds", "ops_per_second"}
    lin = doc["checkers"]["linearizable"]  # each checker's document once (issue 22)
    assert lin["ops"] == 2
    assert lin["failing_keys"] == []
    assert lin["results"] == []
    assert err == ""


def test_invalid_history_exits_1_with_counterexample(tmp_path: Path) -> None:
    path = _write(tmp_path / "h.jsonl", 7)
    code, out, _ = _run(["jepsen", "check", "--workload", "register", "--compact", str(path)])
    assert code == EXIT_INVALID == 1
    assert out.count("\n") == 1
    doc = json.loads(out)
    assert doc["valid"] is False
    lin = doc["checkers"]["linearizable"]
    assert lin["failing_keys"] == ["x"]
    (result,) = lin["results"]
    ce = result["counterexample"]
    assert [s["op"]["value"] for s in ce["linearized"]] == [1]
    assert ce["blocked"]["f"] == "read"
    assert ce["blocked"]["result"] == 7


def test_exhausted_budget_exits_4(tmp_path: Path) -> None:
    path = _write(tmp_path / "h.jsonl", 999, writers=8)
    # --no-stats: the pending writes never succeed, which the stats checker would call invalid.
    code, out, _ = _run(["jepsen", "check", "--json", "--no-stats", "--step-limit", "20",
                         str(path)])
    assert code == EXIT_UNKNOWN == 4
    doc = json.loads(out)
    assert doc["valid"] == "unknown"
    lin = doc["checkers"]["linearizable"]
    assert lin["unknown_keys"] == ["x"]
    assert lin["results"][0]["reason"] == "step limit"
    # Without the step limit the same file is decided.
    code, out, _ = _run(["jepsen", "check", "--no-stats", "--time-limit", "0", str(path)])
    assert code == EXIT_INVALID


def test_text_verdict_by_default(tmp_path: Path) -> None:
    """Without --json: a short plain verdict, one line per checker, then the counterexample."""
    code, out, _ = _run(["jepsen", "check", str(_write(tmp_path / "h.jsonl", 7))])
    assert code == EXIT_INVALID
    lines = out.splitlines()
    assert lines[0] == "INVALID (register)"
    assert lines[1].startswith("  linearizable: INVALID; 2 ops on 1 keys; not linearizable: 'x'")
    assert "cannot place next: read" in out
    assert lines[-2] == "  stats: valid"
    assert lines[-1].startswith("2 operations checked in ")
    code, out, _ = _run(["jepsen", "check", str(_write(tmp_path / "ok.jsonl", 1))])
    assert code == EXIT_VALID
    assert out.splitlines()[0] == "valid (register)"


def test_malformed_history_exits_3_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    good = _write(tmp_path / "good.jsonl", 1).read_text().splitlines()
    path.write_text("\n".join([good[0], '{"index": 1, "time": 1}', *good[2:]]) + "\n")
    code, out, err = _run(["jepsen", "check", str(path)])
    assert code == EXIT_BAD_HISTORY == 3
    assert out == ""
    assert "line 2" in err
    assert "missing field" in err


def test_register_value_errors_exit_3(tmp_path: Path) -> None:
    path = tmp_path / "cas.jsonl"
    lines = [
        {"index": 0, "time": 0, "process": 0, "type": "invoke", "f": "cas", "key": 1, "value": 3},
        {"index": 1, "time": 1, "process": 0, "type": "ok", "f": "cas", "key": 1, "value": 3},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    code, out, err = _run(["jepsen", "check", str(path)])
    assert code == EXIT_BAD_HISTORY
    assert out == ""
    assert "line 1" in err
    assert "[expected, new]" in err


def test_missing_file_exits_3(tmp_path: Path) -> None:
    code, out, err = _run(["jepsen", "check", str(tmp_path / "nope.jsonl")])
    assert code == EXIT_BAD_HISTORY
    assert out == ""
    assert "cannot read history" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["jepsen", "check", "--workload", "queue", "h"],
        ["jepsen", "check", "--time-limit", "-1", "h"],
        ["jepsen", "check", "--step-limit", "0", "h"],
        ["jepsen"],
    ],
)
def test_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(argv)
    assert exc.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_help_reads_well(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(["jepsen", "check", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for phrase in ("JSON Lines", "exit status", "--workload", "--time-limit", "unknown"):
        assert phrase in text
