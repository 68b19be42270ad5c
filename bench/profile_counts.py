"""Per committed request, what one node did: counts from a cProfile dump of a node process
(`bench/leaderless.py --cprofile DIR` writes one per protocol and round).

Call counts are exact whatever the profiler's overhead (the times are not: the profiled node
runs slower than its peers, so it receives more of their messages before its own client
copies, and may fall behind). Counted over the node's whole session (start-up, every level),
divided by the requests it handled: the larger of the client calls it received (a
leaderless node gets every transaction from its client) and the requests it applied (a
PBFT primary applies every request; a profiled node that fell behind applied fewer):

- Ready bundles: steps of the core (`runtime.driver` `_step` and `_step_internal`);
- client calls, peer messages received (`driver.deliver`, `deliver_inline`) and sent
  (`transport.send_nowait`);
- Ed25519 signatures made (`crypto_sign`) and checked (`crypto_sign_open`), HMACs;
- core-state journal appends (`persistence.save_state`), WAL appends (`persist_log`), fsyncs.

    .venv/bin/python bench/profile_counts.py DIR/r1/leaderless-n1.prof DIR/r1/pbft-n1.prof
"""

from __future__ import annotations

import argparse
import pstats

ROWS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("Ready bundles (core steps)", (("runtime/driver.py", "_step"),
                                    ("runtime/driver.py", "_step_internal"))),
    ("client calls received", (("runtime/driver_calls.py", "_on_call"),)),
    ("peer messages received", (("runtime/driver_inline.py", "deliver"),
                                ("runtime/driver_inline.py", "deliver_inline"))),
    ("peer messages sent", (("net/transport.py", "send_nowait"),)),
    ("Ed25519 signatures made", (("~", "<built-in method _sodium.crypto_sign>"),)),
    ("Ed25519 signatures checked", (("~", "<built-in method _sodium.crypto_sign_open>"),)),
    ("HMACs", (("hmac.py", "new"),)),
    ("core-state journal appends", (("runtime/persistence.py", "save_state"),)),
    ("WAL appends", (("runtime/persistence.py", "persist_log"),)),
    ("fsyncs", (("~", "<built-in method posix.fsync>"),)),
)
APPLIED = ("apps/replica.py", "_apply_request")
CALLS = ("runtime/driver_calls.py", "_on_call")


def count(stats: pstats.Stats, wanted: tuple[tuple[str, str], ...]) -> int:
    total = 0
    for (path, _line, name), row in stats.stats.items():  # type: ignore[attr-defined]
        if any(path.endswith(p) or (p == "~" and path == "~") for p, n in wanted
               if n == name):
            total += row[1]
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("profiles", nargs="+", help="cProfile dumps of node processes")
    args = p.parse_args()
    columns = []
    for path in args.profiles:
        stats = pstats.Stats(path)
        handled = max(count(stats, (APPLIED,)), count(stats, (CALLS,)), 1)
        columns.append((path, handled, [count(stats, w) / handled for _, w in ROWS]))
    width = max(len(r) for r, _ in ROWS)
    print(f"{'per request, one node':{width}}  " + "  ".join(
        f"{path.rsplit('/', 1)[-1]:>20}" for path, _, _ in columns))
    print(f"{'(requests: calls or applied)':{width}}  " + "  ".join(
        f"{handled:>20}" for _, handled, _ in columns))
    for i, (label, _) in enumerate(ROWS):
        print(f"{label:{width}}  " + "  ".join(f"{vals[i]:>20.2f}" for _, _, vals in columns))


if __name__ == "__main__":
    main()
