"""Run store layout, the latest link, report rendering, and `jepsen check` for bank/set."""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path

from phalanx.jepsen.checker import check_history
from phalanx.jepsen.cli import EXIT_INVALID, EXIT_VALID, add_jepsen_command
from phalanx.jepsen.history import HistoryRecorder, read_history, write_history
from phalanx.jepsen.nemesis import FaultEvent
from phalanx.jepsen.report import nemesis_intervals, render_report
from phalanx.jepsen.store import create_run

NOW = dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=dt.UTC)


def bank_history(*, broken: bool) -> HistoryRecorder:
    rec = HistoryRecorder()
    t = 0
    rec.invoke(process=0, f="init", value={"a": 5, "b": 5}, time=t)  # type: ignore[arg-type]
    rec.complete(process=0, type="ok", time=t + 1_000_000)
    fault = FaultEvent(at_ns=0, action="start", fault="kill", episode=0, nodes=("n1",))
    rec.nemesis(f="kill", value=fault.describe(), time=2_000_000)
    for i in range(1, 40):
        t = i * 50_000_000
        rec.invoke(process=i % 3 + 1, f="read", time=t)
        seen = {"a": 5, "b": 4 if broken and i == 20 else 5}
        rec.complete(process=i % 3 + 1, type="ok", value=seen, time=t + 3_000_000)  # type: ignore[arg-type]
        rec.invoke(process=7, f="transfer", value={"from": "a", "to": "b", "amount": 0},  # type: ignore[arg-type]
                   time=t + 4_000_000)
        rec.complete(process=7, type="fail" if i % 2 else "ok", time=t + 9_000_000)
    stop = FaultEvent(at_ns=0, action="stop", fault="kill", episode=0, nodes=("n1",))
    rec.nemesis(f="kill", value=stop.describe(), time=t + 10_000_000)
    return rec


def test_store_layout_and_latest_link(tmp_path: Path) -> None:
    schedule = (FaultEvent(at_ns=5, action="start", fault="pause", episode=0, nodes=("n2",)),)
    a = create_run(tmp_path, "bank-kill", config={"nodes": 5}, seed=42, schedule=schedule, now=NOW)
    b = create_run(tmp_path, "bank-kill", config={"nodes": 5}, seed=43, now=NOW)
    assert a.path == tmp_path / "bank-kill" / "20240506T070809Z"
    assert b.path == tmp_path / "bank-kill" / "20240506T070809Z-1"  # same second: suffixed
    latest = tmp_path / "latest"
    assert latest.is_symlink()
    assert not Path(str(latest.readlink())).is_absolute()
    assert latest.resolve() == b.path.resolve()
    doc = json.loads((a.path / "test.json").read_text())
    assert doc["seed"] == 42
    assert doc["config"] == {"nodes": 5}
    assert doc["nemesis_schedule"][0]["fault"] == "pause"
    assert set(doc["versions"]) == {"phalanx", "python", "trio"}
    rec = bank_history(broken=False)
    a.write_history(rec.history())
    assert read_history(a.path / "history.jsonl").ops == rec.history().ops
    log = tmp_path / "n1.log"
    log.write_text("hello\n")
    data = tmp_path / "n1-data"
    (data / "wal").mkdir(parents=True)
    (data / "wal" / "0001").write_bytes(b"x")
    node = a.copy_node("n1", log=log, data=data)
    assert (node / "n1.log").read_text() == "hello\n"
    assert (node / "data" / "wal" / "0001").read_bytes() == b"x"


def test_report_renders_plots_verdicts_and_counterexample(tmp_path: Path) -> None:
    store = create_run(tmp_path, "bank", config={}, now=NOW)
    history = bank_history(broken=True).history()
    store.write_history(history)
    result = check_history("bank", history)
    assert result.valid is False
    store.write_results(result)
    page = render_report(store.path).read_text()
    for name in ("latency.svg", "rate.svg"):
        svg = (store.path / name).read_text()
        ET.fromstring(svg)  # well-formed XML
        assert svg.startswith("<svg ")
        assert 'class="nemesis"' in svg  # the fault interval is shaded
        assert f'src="{name}"' in page
    latency = ET.fromstring((store.path / "latency.svg").read_text())
    labels = {g.get("data-label") for g in latency.iter("{http://www.w3.org/2000/svg}g")}
    ops = {f"{p.invoke.f} {p.outcome}" for p in history.pairs if p.completion is not None}
    assert ops <= labels  # one series per (f, outcome) drawn
    points = sum(len(g) for g in latency.iter("{http://www.w3.org/2000/svg}g")
                 if g.get("class") == "series")
    assert points == sum(1 for p in history.pairs if p.completion is not None)
    assert "INVALID" in page
    assert ">bank<" in page
    assert ">stats<" in page
    assert "wrong-total" in page  # the bad read's counterexample
    assert 'class="op fail"' in page
    assert 'class="nem"' in page
    intervals, events = nemesis_intervals(history)
    assert [(i.start, i.stop) for i in intervals] == [(0.002, 1.96)]
    assert events == []


def test_register_counterexample_in_report(tmp_path: Path) -> None:
    rec = HistoryRecorder()
    rec.invoke(process=0, f="write", key="x", value=1, time=0)
    rec.complete(process=0, type="ok", time=10)
    rec.invoke(process=1, f="read", key="x", time=20)
    rec.complete(process=1, type="ok", value=2, time=30)
    rec.nemesis(f="pause", value="n3", time=31)
    store = create_run(tmp_path, "reg", config={}, now=NOW)
    store.write_history(rec.history())
    store.write_results(check_history("register", rec.history()))
    page = render_report(store.path).read_text()
    for phrase in ("linearizable", "counterexamples", "blocked"):
        assert phrase in page
    assert "n3" in page  # an unpaired nemesis event is listed


def _check(argv: list[str]) -> tuple[int, dict[str, object]]:
    parser = argparse.ArgumentParser(prog="phalanx")
    add_jepsen_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["jepsen", "check", "--json", *argv])
    out = io.StringIO()
    code = args.handler(args, stdout=out, stderr=io.StringIO())
    return code, json.loads(out.getvalue())


def test_cli_checks_bank_and_set_and_writes_a_report(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    write_history(good, bank_history(broken=False).ops)
    write_history(bad, bank_history(broken=True).ops)
    code, doc = _check(["--workload", "bank", str(good)])
    assert code == EXIT_VALID
    assert doc["checkers"] == {  # type: ignore[comparison-overlap]
        "bank": doc["checkers"]["bank"], "stats": doc["checkers"]["stats"]}  # type: ignore[index]
    code, doc = _check(["--workload", "bank", "--report", str(tmp_path / "store"), str(bad)])
    assert code == EXIT_INVALID
    index = Path(str(doc["report"]))
    assert index.name == "index.html"
    assert index.exists()
    assert (tmp_path / "store" / "latest" / "index.html").exists()
    assert json.loads((index.parent / "results.json").read_text())["valid"] is False

    rec = HistoryRecorder()
    rec.invoke(process=0, f="add", key="s", value=1, time=0)
    rec.complete(process=0, type="ok", time=1)
    rec.invoke(process=1, f="read", key="s", time=2)
    rec.complete(process=1, type="ok", value=(), time=3)
    path = tmp_path / "set.jsonl"
    write_history(path, rec.ops)
    code, doc = _check(["--workload", "set", str(path)])
    assert code == EXIT_INVALID
    assert doc["checkers"]["set"]["lost_count"] == 1  # type: ignore[index]


def test_report_needs_no_matplotlib() -> None:
    """The base install has no matplotlib (issue 22): the report must not import it."""
    import subprocess
    import sys

    code = ("import sys, phalanx.jepsen.report, phalanx.jepsen.harness.runner; "
            "print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
