"""The ``load`` experiment of `bench/scale.py`: PBFT and the leaderless core under a load
that matters (issue 19 item 4, docs/SCALE.md "Under load").

Owns: `LoadRow` (one cell's figures), `load_shape` (the run's clients and windows),
`measure_load` (one cell), its table and `--plot-from` parse-back, and `plot_load`
(docs/scale_load.png).

A load level is a number of closed-loop clients per region (5 regions: level x 5 clients,
placed round-robin like the nodes), each with one operation outstanding and a think time
of 0-10 ms between two (the register clients' `ClientConfig.think_ns`; the leaderless
clients get the same). Each client issues from t = 0 to `seconds` (the leaderless ones stop
there; the register ones go on through half of the `after` seconds, as in every cell).
Figures count a window ``[warmup, seconds)`` of virtual time, past the pipeline's fill:
- p50 / p99: commit latency of the operations invoked in the window (PBFT: writes and
  CAS, as in the base cells; leaderless: every committed transaction);
- ops/s: operations completed ok in the window (PBFT: reads too, they are ordered as well)
  over its length;
- with the CPU model: the busiest node (its name: PBFT's primary is n1), its CPU share over
  the whole run (its CPU time over ``seconds + after``), the mean time a message waited in
  its queue before being handled, and the longest queue at any node.

PBFT runs with ``batch_size=32``, ``checkpoint_interval=32`` and ``log_window=64`` here (as
deployed PBFTs batch and pipeline; the simulator's 4, 8 and 16, sized for seeds that cross
checkpoints and water marks quickly, would cap PBFT at ~16 batches per round trip before
its CPU is busy: at n = 60, ~30% of the primary's); `--set` still overrides.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from phalanx.jepsen.sim.run import RunResult
from phalanx.protocols import CallStrategy
from phalanx.protocols import get as protocol_spec

MS = 1_000_000
REGIONS = 5
LOADS = (1, 4, 16)
"""Default clients per region."""

PBFT_LOAD_SETTINGS: tuple[tuple[str, int | bool | str], ...] = (
    ("batch_size", 32), ("checkpoint_interval", 32), ("log_window", 64))
LEADERLESS_LOAD_SETTINGS: tuple[tuple[str, int | bool | str], ...] = (
    ("ops_per_client", 1_000_000), ("submit_to", 0), ("think_ns", 10 * MS))


@dataclass(frozen=True, slots=True)
class LoadRow:
    protocol: str
    n: int
    clients: int
    ops_per_s: float
    p50_ms: float
    p99_ms: float
    busiest: str
    busiest_pct: float
    wait_ms: float
    max_queue: int
    cpu_s: float
    ok: bool
    note: str = ""


def load_shape(n: int, seconds: float | None, warmup: float | None,
               after: float | None) -> tuple[float, float, float]:
    """(seconds, warmup, after) of a load cell: shorter where every operation costs ~n^2
    deliveries (n = 180: 2 s of clients, a window of 1 s after 1 s of warm-up). `after` is 2
    s: the liveness check's final reads go out halfway through it, and with 1 s they had
    0.5 s against PBFT's ~0.45 s commit plus batching (a check that failed for the window,
    not the protocol)."""
    base = (2.0, 1.0, 2.0) if n >= 180 else (3.0, 1.0, 2.0)
    return (seconds if seconds is not None else base[0],
            warmup if warmup is not None else base[1],
            after if after is not None else base[2])


def window_figures(result: RunResult, *, endorsing: bool, start_ns: int, end_ns: int
                   ) -> tuple[list[int], int]:
    """(commit latencies of the operations invoked in [start, end), operations completed
    ok in [start, end))."""
    if endorsing:
        times = result.commit_times_ns
        return ([done - at for at, done in times if start_ns <= at < end_ns],
                sum(1 for _, done in times if start_ns <= done < end_ns))
    invoked: dict[object, tuple[int, str]] = {}
    lat: list[int] = []
    completed = 0
    for op in result.history:
        if op.process == "nemesis":
            continue
        if op.type == "invoke":
            invoked[op.process] = (op.time, op.f)
        elif op.type == "ok" and op.process in invoked:
            at, f = invoked.pop(op.process)
            if start_ns <= op.time < end_ns:
                completed += 1
            if f in ("write", "cas") and start_ns <= at < end_ns:
                lat.append(op.time - at)
        else:
            invoked.pop(op.process, None)
    return lat, completed


def load_row(result: RunResult, *, protocol: str, n: int, clients: int, endorsing: bool,
             seconds: float, warmup: float, after: float, cpu_s: float,
             percentile: Callable[[list[int], float], float]) -> LoadRow:
    lat, completed = window_figures(result, endorsing=endorsing, start_ns=int(warmup * 1e3) * MS,
                                    end_ns=int(seconds * 1e3) * MS)
    st = result.stats
    handled = st.get("cpu_busiest_handled", 0)
    node = st.get("cpu_busiest_node", -1)
    note = "" if result.ok else "; ".join(v[:90] for v in result.violations[:2])
    return LoadRow(
        protocol=protocol, n=n, clients=clients,
        ops_per_s=completed / (seconds - warmup),
        p50_ms=percentile(lat, 0.5) / MS, p99_ms=percentile(lat, 0.99) / MS,
        busiest=f"n{node}" if node >= 0 else "-",
        busiest_pct=100 * st.get("cpu_busiest_ms", 0) / ((seconds + after) * 1e3)
        if "cpu_busiest_ms" in st else math.nan,
        wait_ms=st.get("cpu_busiest_wait_ms", 0) / handled if handled else math.nan,
        max_queue=st.get("cpu_max_queue", 0), cpu_s=cpu_s, ok=result.ok, note=note)


LOAD_HEADER = ("| load | protocol | n | clients | ops/s | p50 ms | p99 ms | busiest | CPU % "
               "| wait ms | max queue | CPU s | check |\n"
               "|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def load_line(r: LoadRow) -> str:
    check = "ok" if r.ok else f"FAIL: {r.note}"
    return (f"| load | {r.protocol} | {r.n} | {r.clients} | {r.ops_per_s:.0f} | {r.p50_ms:.0f} "
            f"| {r.p99_ms:.0f} | {r.busiest} | {r.busiest_pct:.0f} | {r.wait_ms:.2f} "
            f"| {r.max_queue} | {r.cpu_s:.1f} | {check} |")


_LOAD = re.compile(r"^\| load \| (\w+) \| (\d+) \| (\d+) \| (\S+) \| (\S+) \| (\S+) \| (\S+) "
                   r"\| (\S+) \| (\S+) \| (\d+) \| (\S+) \| (ok|FAIL[^|]*) \|$")


_PROGRESS = re.compile(
    r"^load n=(\d+) (\w+), (\d+) clients: (\S+) ops/s, p50 (\S+) ms, p99 (\S+) ms, "
    r"cpu (\S+) s, [\d,]+ deliveries, busiest (\S+) (\S+)% CPU, mean wait (\S+) ms, "
    r"longest queue (\d+), .*?( FAILED (.*))?$")


def _from_progress(line: str) -> LoadRow | None:
    """A cell's progress line (a run stopped before its table was printed)."""
    m = _PROGRESS.match(line.strip())
    if m is None:
        return None
    return LoadRow(protocol=m[2], n=int(m[1]), clients=int(m[3]), ops_per_s=float(m[4]),
                   p50_ms=float(m[5]), p99_ms=float(m[6]), busiest=m[8],
                   busiest_pct=float(m[9]), wait_ms=float(m[10]), max_queue=int(m[11]),
                   cpu_s=float(m[7]), ok=m[12] is None, note=m[13] or "")


def load_rows_from(paths: list[str]) -> list[LoadRow]:
    """The load-table lines of earlier reports (`--plot-from`); of a report without its
    table (a run stopped early), its cells' progress lines."""
    rows: list[LoadRow] = []
    for path in paths:
        lines = Path(path).read_text().splitlines()
        if not any(_LOAD.match(line.strip()) for line in lines):
            rows += [r for r in map(_from_progress, lines) if r is not None]
            continue
        for line in lines:
            m = _LOAD.match(line.strip())
            if m is None:
                continue
            rows.append(LoadRow(protocol=m[1], n=int(m[2]), clients=int(m[3]),
                                ops_per_s=float(m[4]), p50_ms=float(m[5]),
                                p99_ms=float(m[6]), busiest=m[7], busiest_pct=float(m[8]),
                                wait_ms=float(m[9]), max_queue=int(m[10]),
                                cpu_s=float(m[11]), ok=m[12] == "ok",
                                note=m[12].removeprefix("FAIL: ")))
    return rows


def _endorsing(protocol: str) -> bool:
    return protocol_spec(protocol).call_strategy is CallStrategy.ENDORSEMENT


def ratios(rows: list[LoadRow]) -> list[str]:
    """Per (n, clients) measured for both: an ordering protocol's p50 (PBFT's) over the
    endorsing one's (the leaderless core's; the registry's `CallStrategy.ENDORSEMENT`)."""
    out = []
    by = {(r.protocol, r.n, r.clients): r for r in rows}
    for (protocol, n, clients), r in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        if _endorsing(protocol) or not r.p50_ms:
            continue
        for other in (o for (p, m, c), o in sorted(by.items())
                      if (m, c) == (n, clients) and _endorsing(p) and o.p50_ms):
            out.append(f"n = {n}, {clients} clients: {protocol} p50 / {other.protocol} p50 = "
                       f"{r.p50_ms / other.p50_ms:.2f} ({protocol} {r.ops_per_s:.0f} ops/s, "
                       f"busiest {r.busiest} {r.busiest_pct:.0f}% CPU; {other.protocol} "
                       f"{other.ops_per_s:.0f} ops/s, busiest {other.busiest_pct:.0f}%)")
    return out


def pyplot() -> ModuleType | None:
    """matplotlib's pyplot on the Agg backend, or None (said on stdout) when matplotlib is
    not installed: the plots are optional, the tables are the result."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib is not installed: no plot written)")
        return None
    return plt


def plot_load(rows: list[LoadRow], out: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    best: dict[tuple[str, int, int], LoadRow] = {}
    for r in rows:  # one point per cell: a passing run over a failed one of the same cell
        key = (r.protocol, r.n, r.clients)
        if key not in best or (r.ok and not best[key].ok):
            best[key] = r
    rows = list(best.values())
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    panels: tuple[tuple[str, Callable[[LoadRow], float]], ...] = (
        ("commit latency p50 (simulated ms)", lambda r: r.p50_ms),
        ("commit latency p99 (simulated ms)", lambda r: r.p99_ms),
        ("busiest node's CPU share (%)", lambda r: r.busiest_pct))
    series = sorted({(r.protocol, r.n) for r in rows})
    for ax, (title, value) in zip(axes, panels, strict=True):
        for protocol, n in series:
            pts = sorted((r.ops_per_s, value(r)) for r in rows
                         if (r.protocol, r.n) == (protocol, n) and not math.isnan(value(r)))
            if pts:
                style = "s--" if _endorsing(protocol) else "o-"
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style,
                        label=f"{protocol}, n = {n}")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("committed ops/s (closed-loop clients, 5 regions)")
        ax.set_xscale("log")
        if "CPU" not in title:
            ax.set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    print(f"wrote {out}")
    return True
