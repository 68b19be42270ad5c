"""The run report: latency and rate plots and a self-contained ``index.html`` for a run.

Owns `render_report(run_dir)`, which reads a run directory laid out by `phalanx.jepsen.store`
(``history.jsonl`` required; ``results.json`` and ``test.json`` if present) and writes:
    * ``latency.svg``: each completed client op's latency against its invoke time, coloured
      by outcome (ok / fail / info) with one marker per ``f``;
    * ``rate.svg``: ok / fail / info completions per second;
    * ``index.html``: the verdict of every checker, links to the files and plots, a per-process
      op timeline (HTML bars coloured by outcome, hover for the op), and for each key or
      read that is not valid its counterexample.
Both plots shade the nemesis intervals. Nemesis events are the history's ``"nemesis"`` ops;
an event whose value reads ``start <fault>#<n> ...`` opens an interval closed by the matching
``stop <fault>#<n>`` (the form `FaultEvent.describe` gives); other events are drawn as lines.

Rules: the plots are SVG drawn by `phalanx.jepsen.report_svg` (no matplotlib: it was most of
the install's size); output depends only on the files read (no clocks); all text is
HTML-escaped. Must not import the
simulator, consensus cores or the client.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from phalanx.jepsen.history import NEMESIS, History, read_history
from phalanx.jepsen.report_svg import Chart

LATENCY_SVG: Final = "latency.svg"
RATE_SVG: Final = "rate.svg"
INDEX_HTML: Final = "index.html"
COLORS: Final = {"ok": "#2a9d4a", "fail": "#d1495b", "info": "#e0a100"}
MAX_TIMELINE_PROCESSES: Final = 64
MAX_TIMELINE_OPS: Final = 5000


@dataclass(frozen=True, slots=True, kw_only=True)
class Interval:
    """A nemesis fault active from `start` to `stop` (seconds; stop None = never healed)."""

    label: str
    start: float
    stop: float | None


def nemesis_intervals(history: History) -> tuple[list[Interval], list[tuple[float, str]]]:
    """Fault intervals and the other (unpaired) nemesis events, times in seconds."""
    open_: dict[str, tuple[float, str]] = {}
    intervals: list[Interval] = []
    events: list[tuple[float, str]] = []
    for op in history.nemesis:
        t = op.time / 1e9
        text = op.value if isinstance(op.value, str) else f"{op.f} {op.value!r}"
        words = text.split()
        if len(words) >= 2 and words[0] in ("start", "stop") and "#" in words[1]:
            if words[0] == "start":
                open_[words[1]] = (t, text)
            elif words[1] in open_:
                began, label = open_.pop(words[1])
                intervals.append(Interval(label=label, start=began, stop=t))
            continue
        events.append((t, f"{op.f} {text}" if op.f not in text else text))
    intervals.extend(Interval(label=label, start=t, stop=None) for t, label in open_.values())
    intervals.sort(key=lambda i: (i.start, i.label))
    return intervals, events


def _shade(chart: Chart, history: History, end: float) -> None:
    intervals, events = nemesis_intervals(history)
    for iv in intervals:
        chart.band(iv.start, end if iv.stop is None else iv.stop)
    for t, _ in events:
        chart.line(t)


def _latency_plot(history: History, out: Path, end: float) -> None:
    chart = Chart(
        title="Operation latency", x_label="time (s)", y_label="latency (ms)",
        x_max=end, height=450, log_y=True,
    )
    fs = sorted({p.invoke.f for p in history.pairs})
    for fi, f in enumerate(fs):
        for kind, color in COLORS.items():
            xs: list[float] = []
            ys: list[float] = []
            for p in history.pairs:
                if p.invoke.f == f and p.completion is not None and p.completion.type == kind:
                    xs.append(p.invoke.time / 1e9)
                    ys.append(max((p.completion.time - p.invoke.time) / 1e6, 1e-3))
            if xs:
                chart.scatter(xs, ys, label=f"{f} {kind}", color=color, marker=fi)
    _shade(chart, history, end)
    out.write_text(chart.svg(), encoding="utf-8")


def _rate_plot(history: History, out: Path, end: float) -> None:
    seconds = int(end) + 1
    chart = Chart(title="Throughput", x_label="time (s)", y_label="completions / s", x_max=end)
    for kind, color in COLORS.items():
        counts = [0] * seconds
        for p in history.pairs:
            if p.completion is not None and p.completion.type == kind:
                counts[min(int(p.completion.time / 1e9), seconds - 1)] += 1
        if any(counts):
            chart.steps([s + 0.5 for s in range(seconds)], counts, label=kind, color=color)
    _shade(chart, history, end)
    out.write_text(chart.svg(), encoding="utf-8")


def _load_json(path: Path) -> dict[str, object] | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def _verdict(v: object) -> str:
    cls = {True: "ok", False: "fail"}.get(v, "info") if isinstance(v, bool) else "info"
    text = {True: "valid", False: "INVALID"}.get(v, "unknown") if isinstance(v, bool) else "unknown"
    return f'<span class="v {cls}">{text}</span>'


def _timeline(history: History, end: float) -> str:
    processes: list[object] = []
    rows: dict[object, list[str]] = {}
    shown = 0
    span = max(end, 1e-9)
    for p in history.pairs:
        proc = p.invoke.process
        if proc not in rows:
            if len(processes) >= MAX_TIMELINE_PROCESSES:
                continue
            processes.append(proc)
            rows[proc] = []
        if shown >= MAX_TIMELINE_OPS:
            break
        shown += 1
        t0 = p.invoke.time / 1e9
        t1 = end if p.completion is None else p.completion.time / 1e9
        left = 100 * t0 / span
        width = max(100 * (t1 - t0) / span, 0.15)
        kind = p.outcome
        done = p.completion
        tip = f"{p.invoke.f} key={p.invoke.key!r} {p.invoke.value!r} -> {kind}"
        if done is not None:
            tip += f" {done.value!r} ({(done.time - p.invoke.time) / 1e6:.1f} ms)"
            if done.error is not None:
                tip += f" error={done.error!r}"
        rows[proc].append(
            f'<div class="op {kind}" style="left:{left:.3f}%;width:{width:.3f}%" '
            f'title="{_e(tip)}"></div>'
        )
    intervals, _ = nemesis_intervals(history)
    shade = "".join(
        f'<div class="nem" style="left:{100 * i.start / span:.3f}%;'
        f'width:{100 * ((end if i.stop is None else i.stop) - i.start) / span:.3f}%" '
        f'title="{_e(i.label)}"></div>'
        for i in intervals
    )
    lines = [
        f'<div class="row"><span class="proc">{_e(proc)}</span><div class="lane">{shade}'
        f"{''.join(rows[proc])}</div></div>"
        for proc in processes
    ]
    more = len({p.invoke.process for p in history.pairs}) - len(processes)
    note = f"<p>{more} more processes not shown.</p>" if more > 0 else ""
    if shown >= MAX_TIMELINE_OPS:
        note += f"<p>Only the first {MAX_TIMELINE_OPS} operations are shown.</p>"
    return "\n".join(lines) + note


def _problems(results: dict[str, object] | None) -> str:
    if not results or not isinstance(results.get("checkers"), dict):
        return ""
    parts: list[str] = []
    checkers = results["checkers"]
    assert isinstance(checkers, dict)  # narrowed above
    for name, doc in sorted(checkers.items()):
        if not isinstance(doc, dict) or doc.get("valid") is True:
            continue
        shown: Sequence[object]
        if name == "linearizable":
            shown = [r for r in doc.get("results", []) if isinstance(r, dict)][:5]
            title = "keys that are not linearizable (counterexamples)"
        elif name == "bank":
            shown = list(doc.get("bad_reads", []))
            title = "bad reads"
        elif name == "set":
            shown = list(doc.get("results", []))
            title = "keys with lost / unexpected / duplicated elements"
        else:
            shown = [doc]
            title = "details"
        parts.append(f"<h3>{_e(name)}: {_e(title)}</h3>")
        for item in shown:
            label = ""
            if isinstance(item, dict) and "key" in item:
                label = f"<h4>key {_e(json.dumps(item['key']))}: {_verdict(item.get('valid'))}</h4>"
            parts.append(f"{label}<pre>{_e(json.dumps(item, indent=2, sort_keys=True))}</pre>")
    return "\n".join(parts)


_CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 10px;text-align:left}
.v{font-weight:bold;padding:1px 6px;border-radius:3px;color:#fff}
.v.ok{background:#2a9d4a}.v.fail{background:#d1495b}.v.info{background:#e0a100}
img{max-width:100%;border:1px solid #ddd;margin:6px 0}
.row{display:flex;align-items:center;height:14px;margin:1px 0}
.proc{width:90px;font-size:11px;text-align:right;padding-right:6px;font-family:monospace}
.lane{position:relative;flex:1;height:12px;background:#f6f6f6}
.op{position:absolute;top:1px;height:10px;min-width:1px;opacity:.85}
.op.ok{background:#2a9d4a}.op.fail{background:#d1495b}.op.info{background:#e0a100}
.nem{position:absolute;top:0;height:12px;background:rgba(120,120,120,.25)}
pre{background:#f6f6f6;padding:8px;overflow:auto;max-height:420px;font-size:12px}
"""


def render_report(run_dir: str | Path) -> Path:
    """Write ``latency.svg``, ``rate.svg`` and ``index.html`` into `run_dir`; returns the HTML.

    Raises:
        OSError, HistoryError: ``history.jsonl`` is missing or malformed.
    """
    run = Path(run_dir)
    history = read_history(run / "history.jsonl")
    results = _load_json(run / "results.json")
    test = _load_json(run / "test.json") or {}
    end = max((op.time for op in history.ops), default=0) / 1e9
    _latency_plot(history, run / LATENCY_SVG, end)
    _rate_plot(history, run / RATE_SVG, end)

    verdict = results.get("valid") if results else "unknown"
    rows = []
    checkers = results.get("checkers") if results else None
    if isinstance(checkers, dict):
        for name, doc in sorted(checkers.items()):
            valid = doc.get("valid") if isinstance(doc, dict) else None
            rows.append(f"<tr><td>{_e(name)}</td><td>{_verdict(valid)}</td></tr>")
    client_ops = [op for op in history.ops if op.process != NEMESIS]
    nemesis_rows = "".join(
        f"<tr><td>{op.time / 1e9:.3f}</td><td>{_e(op.f)}</td><td>{_e(op.value)}</td></tr>"
        for op in history.nemesis
    )
    files = [
        n for n in ("test.json", "history.jsonl", "results.json", "nodes") if (run / n).exists()
    ]
    title = f"{test.get('test', run.parent.name)} {run.name}"
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>
<style>{_CSS}</style></head><body>
<h1>{_e(title)}: {_verdict(verdict)}</h1>
<p>workload <b>{_e(results.get("workload", "?") if results else "?")}</b>,
{len(history.pairs)} client operations ({len(client_ops)} events),
{len(history.nemesis)} nemesis events, {end:.1f} s; seed {_e(test.get("seed"))}.</p>
<h2>Checkers</h2><table><tr><th>checker</th><th>verdict</th></tr>{"".join(rows)}</table>
<p>Files: {" · ".join(f'<a href="{_e(n)}">{_e(n)}</a>' for n in files)}</p>
<h2>Latency</h2><a href="{LATENCY_SVG}"><img src="{LATENCY_SVG}" alt="latency"></a>
<h2>Throughput</h2><a href="{RATE_SVG}"><img src="{RATE_SVG}" alt="rate"></a>
<h2>Problems</h2>{_problems(results) or "<p>None.</p>"}
<h2>Timeline</h2><p>One row per process; green ok, red fail, amber info (indeterminate);
grey bands are nemesis faults. Hover an op for details.</p>
{_timeline(history, end)}
<h2>Nemesis</h2><table><tr><th>t (s)</th><th>f</th><th>value</th></tr>{nemesis_rows}</table>
</body></html>
"""
    out = run / INDEX_HTML
    out.write_text(page, encoding="utf-8")
    return out
