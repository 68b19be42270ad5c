"""System calls per single-client write of a 3-node Raft cluster in one process (strace -c).

Usage (from bench/)::

    ../.venv/bin/python syscalls_per_write.py                 # 200 and 600 writes
    ../.venv/bin/python syscalls_per_write.py --writes 100,400

Runs `inproc_cpu.py` (three nodes and a client in one process, TLS on loopback, fsync
"group", a long tick: see ``--tick-ms``) under ``strace -c -f`` twice, with N1 and N2
writes, and prints
``(calls(N2) - calls(N1)) / (N2 - N1)`` per system call: the calls one write costs, with
start-up (certificates, elections, connections) cancelled out. Unlike CPU time, a count
does not drift with this machine's clock or its load, so it is the figure to compare
two trees by: every send, receive, epoll change and wake-up is one here, and each costs
kernel time and, across processes, a scheduling hop. Run it with each tree's interpreter
path (``PYTHONPATH``) to compare them.

Must not be imported by the package. Needs `strace`. Loopback only; inproc_cpu.py removes
its temporary directory.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def parse_summary(text: str) -> dict[str, int]:
    """``strace -c`` output: calls per system call name (the total row excluded)."""
    calls: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 5 or not parts[0][0].isdigit() or not parts[-1].isidentifier():
            continue
        if parts[-1] == "total":
            continue
        calls[parts[-1]] = int(parts[3])
    return calls


def per_write(small: dict[str, int], large: dict[str, int], writes: int) -> dict[str, float]:
    """Calls per write, from the summaries of two runs `writes` writes apart."""
    names = sorted(set(small) | set(large))
    return {n: (large.get(n, 0) - small.get(n, 0)) / writes for n in names}


def _count(writes: int, warmup: int, tick_ms: int, out: Path) -> dict[str, int]:
    here = Path(__file__).resolve().parent
    subprocess.run(
        ["strace", "-c", "-f", "-o", str(out), sys.executable, str(here / "inproc_cpu.py"),
         "--writes", str(writes), "--warmup", str(warmup), "--tick-ms", str(tick_ms)],
        check=True, cwd=here, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    return parse_summary(out.read_text())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--writes", default="200,600", help="N1,N2: the two runs' write counts")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--top", type=int, default=10, help="system calls listed")
    p.add_argument("--tick-ms", type=int, default=200,
                   help="the nodes' tick: long, so that ticks and heartbeats (whose number "
                   "per write grows with the wall time a write takes, i.e. with the load) "
                   "stay out of the count")
    args = p.parse_args(argv)
    n1, n2 = (int(x) for x in args.writes.split(","))
    if not 0 < n1 < n2:
        p.error("--writes needs 0 < N1 < N2")
    if shutil.which("strace") is None:
        p.error("strace is not installed")
    with tempfile.TemporaryDirectory(prefix="syscalls-") as tmp:
        small = _count(n1, args.warmup, args.tick_ms, Path(tmp) / "small")
        large = _count(n2, args.warmup, args.tick_ms, Path(tmp) / "large")
    rates = per_write(small, large, n2 - n1)
    total = sum(rates.values())
    top = sorted(rates.items(), key=lambda kv: -kv[1])[: args.top]
    print(f"system calls per write (3 nodes + client, one process): {total:.1f}; load "
          f"{os.getloadavg()[0]:.2f}")
    for name, rate in top:
        print(f"  {name:16s} {rate:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
