"""Where a node's CPU goes: py-spy stacks from `cpu_per_write.py --profile` as shares per part.

Usage (from bench/)::

    ../.venv/bin/python cpu_per_write.py --protocol pbft --clients 1,64 --profile /tmp/spy
    ../.venv/bin/python profile_share.py /tmp/spy/c1-*.txt /tmp/spy/c64-*.txt
    ../.venv/bin/python profile_share.py --ms-per-write 1.63 /tmp/spy/c1-leader-n1.txt

Each sample (a raw collapsed stack with its count) goes to the part of the code its
LEAF-most recognised frame belongs to (`PARTS`, first match from the innermost frame out),
so the codec called by the transport counts as codec, a signature check inside the core as
crypto, a `SSLObject.read` inside the receive loop as tls. Prints one row per file: the
number of samples, the share spent waiting (`WAITS`), then each part's share in percent
of the samples that were not waiting (and, with ``--ms-per-write`` given once
per file in the same order, its CPU milliseconds per write: the share times the node's CPU
per write that `cpu_per_write.py` printed). py-spy sees Python frames only: time inside a C
call (a syscall, OpenSSL, msgpack) is charged to the Python frame that made it.

Must not be imported by the package.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path


def _socket_lines() -> str:
    """The lines of this tree's net/tls_stream.py that call the socket's recv/send."""
    source = Path(__file__).resolve().parent.parent / "net" / "tls_stream.py"
    return "|".join(str(n) for n, line in enumerate(source.read_text().splitlines(), 1)
                    if "raw.recv(" in line or "raw.send(" in line)


PARTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # The lines of net/tls_stream.py that call the socket's recv/send (the syscalls).
    ("socket", re.compile(rf"\(net/tls_stream\.py:({_socket_lines()})\)$")),
    ("codec", re.compile(r"\(net/codec|\(phalanx/net/codec|\(msgpack/|\(net/wire\.py")),
    ("crypto", re.compile(r"\(net/crypto\.py|\(nacl/|consensus/crypto\.py|\(hashlib")),
    ("tls", re.compile(r"\(ssl\.py|\(net/tls_stream\.py")),
    ("framing", re.compile(r"\(net/framing\.py")),
    ("transport", re.compile(r"\(net/transport|\(net/conn_gate\.py")),
    ("storage", re.compile(r"\(storage/|\(phalanx/runtime/persistence\.py|group_commit\.py")),
    ("core", re.compile(r"\(consensus/")),
    ("replica+app", re.compile(r"\(apps/")),
    ("client port", re.compile(r"\(phalanx/runtime/client_|\(net/client_protocol\.py")),
    ("metrics", re.compile(r"\(phalanx/runtime/metrics|\(prometheus_client/")),
    ("driver", re.compile(r"\(phalanx/runtime/|\(phalanx/protocols/")),
    ("trio", re.compile(r"\(trio/|\(outcome/|\(selectors\.py|\(socket\.py")),
)
"""(part, frame pattern), tried in this order on each frame, innermost frame first."""

WAITS = re.compile(
    r"\(trio/_core/_thread_cache\.py:211\)$|\(apps/writer\.py:227\)$|\(selectors\.py:\d+\)$"
    r"|^_paced \(apps/writer\.py:\d+\)$"
    r"|EpollIOManager\.get_events|\(storage/directory\.py:222\)$|\(threading\.py:\d+\)$"
    r"|^_worker \(concurrent/futures/thread\.py:\d+\)$"
)
"""Innermost frames where a thread blocks rather than computes (a worker or the checkpoint
writer waiting for work, its `_paced` hand-off sleeps, a thread pool's idle `_worker` (its
queue wait is a C call), the metrics server's select, trio's epoll_wait, fsync): py-spy's
own idle detection does not see them as idle in this VM, so they are counted apart
(``wait``, as a share of all samples) and left out of the parts' shares."""


def shares(path: Path) -> tuple[int, Counter[str]]:
    """(total samples, samples per part, ``wait`` included) of one py-spy raw file."""
    counts: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        if WAITS.search(frames[-1]):
            counts["wait"] += n
            continue
        part = "other"
        for frame in reversed(frames):
            hit = next((name for name, pattern in PARTS if pattern.search(frame)), None)
            if hit is not None:
                part = hit
                break
        counts[part] += n
    return total, counts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--ms-per-write", type=float, action="append", default=None,
                   help="the node's CPU ms per write, once per file in order: adds ms columns")
    args = p.parse_args()
    if args.ms_per_write is not None and len(args.ms_per_write) != len(args.files):
        p.error("give --ms-per-write once per file, in the files' order")
    names = [name for name, _ in PARTS] + ["other"]
    print(f"{'file':28} {'samples':>7} {'wait':>5} " + " ".join(f"{n:>11}" for n in names))
    for i, path in enumerate(args.files):
        total, counts = shares(path)
        busy = total - counts["wait"]
        if busy <= 0:
            print(f"{path.name:28} {total:7}")
            continue
        cells = []
        for name in names:
            share = counts[name] / busy
            if args.ms_per_write is None:
                cells.append(f"{100 * share:10.1f}%")
            else:
                cells.append(f"{share * args.ms_per_write[i]:8.3f} ms")
        wait = f"{100 * counts['wait'] / total:4.0f}%"
        print(f"{path.name:28} {total:7} {wait} " + " ".join(cells))


if __name__ == "__main__":
    main()
