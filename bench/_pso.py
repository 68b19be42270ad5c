"""PySyncObj side of `bench/kv.py`: three `ReplDict` node processes with blocking clients.

PySyncObj has no external client: a client is code running inside a member process calling a
replicated method. So each node process here runs a `SyncObj` with a `ReplDict` plus the
closed-loop client threads assigned to it, each calling `ReplDict.set(key, value, sync=True)`
(PySyncObj's blocking call: returns once the entry is committed and applied locally).
Clients are spread round-robin over the members starting with the leader (a single client
therefore sits on the leader, PySyncObj's best case). Latencies are measured in the node
processes against `time.monotonic()` (one system-wide clock on Linux) and shipped back as
JSON lines over the node's stdout; the driver measures the processes' CPU, which includes
the client threads.

Configuration is PySyncObj's default (`SyncObjConf()`: in-memory journal, no fsync, batching
on, log compaction every 5,000 entries) unless `--pso-conf` JSON overrides it.

Run as a script only by the driver: `python bench/_pso.py node INDEX PORTS CONF_JSON`.
Must not import phalanx. Loopback only. The node speaks PySyncObj's own (pickle-based)
protocol to its peers; nothing here unpickles data from outside the benchmark's own processes.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _loadgen import LOOPBACK, CpuMeter, LevelResult, stop_process, summarise

from phalanx.ops.ports import free_ports


class PsoError(RuntimeError):
    """A PySyncObj node process failed or answered unexpectedly."""


def pysyncobj_version() -> str | None:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover - stdlib since 3.8
        return None
    try:
        return version("pysyncobj")
    except PackageNotFoundError:
        return None


# --------------------------------------------------------------------------------------------
# Node process


def _run_clients(store: Any, cmd: dict[str, Any]) -> dict[str, Any]:
    """Run one level's blocking client threads inside a node process; return its results."""
    start = float(cmd["window_start"])
    end = start + float(cmd["duration"])
    value = b"x" * int(cmd["value_size"])
    lat: list[int] = []
    errors = [0]
    last_error: list[str] = []
    lock = threading.Lock()

    def client(cid: str) -> None:
        seq = 0
        mine: list[int] = []
        while True:
            t0 = time.monotonic()
            if t0 > end:
                break
            try:
                store.set(f"{cid}-{seq}", value, sync=True, timeout=5)
            except Exception as e:  # PySyncObj raises SyncObjException and friends
                t1 = time.monotonic()
                if start <= t1 <= end:
                    with lock:
                        errors[0] += 1
                        if not last_error:
                            last_error.append(f"{type(e).__name__}: {e}")
                time.sleep(0.01)
                continue
            finally:
                seq += 1
            t1 = time.monotonic()
            if start <= t1 <= end:
                mine.append(int((t1 - t0) * 1e6))
        with lock:
            lat.extend(mine)

    threads = [
        threading.Thread(target=client, args=(f"{cmd['prefix']}{c}",), daemon=True)
        for c in cmd["clients"]
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"lat_us": lat, "errors": errors[0], "err": last_error[0] if last_error else ""}


def _node_main(index: int, ports: list[int], conf_json: str) -> int:
    from pysyncobj import SyncObj, SyncObjConf  # type: ignore[import-untyped]
    from pysyncobj.batteries import ReplDict  # type: ignore[import-untyped]

    addrs = [f"{LOOPBACK}:{p}" for p in ports]
    store = ReplDict()
    node = SyncObj(
        addrs[index],
        [a for i, a in enumerate(addrs) if i != index],
        conf=SyncObjConf(**json.loads(conf_json)),
        consumers=[store],
    )

    def reply(obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    def leader() -> str | None:
        lead = node._getLeader()
        return str(lead.id) if lead is not None else None

    deadline = time.monotonic() + 30
    while not (node.isReady() and leader() is not None):
        if time.monotonic() > deadline:
            reply({"error": "no leader after 30 s"})
            return 1
        time.sleep(0.05)
    reply({"ready": True, "self": addrs[index], "leader": leader()})

    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        if cmd["op"] == "leader":
            reply({"leader": leader()})
            continue
        if cmd["op"] != "run":
            reply({"error": f"unknown op {cmd['op']!r}"})
            continue
        reply(_run_clients(store, cmd))
    node.destroy()
    return 0


# --------------------------------------------------------------------------------------------
# Driver


class PsoCluster:
    """Three PySyncObj node processes started (and stopped by pid) by the benchmark."""

    name = "pysyncobj"

    def __init__(self, *, conf: dict[str, Any] | None = None, members: int = 3) -> None:
        self._ports = free_ports(members)
        self._conf = json.dumps(conf or {})
        self._procs: list[subprocess.Popen[bytes]] = []
        self.addrs = [f"{LOOPBACK}:{p}" for p in self._ports]
        self.leader: str | None = None

    def start(self) -> None:
        script = str(Path(__file__).resolve())
        ports = ",".join(str(p) for p in self._ports)
        for i in range(len(self._ports)):
            self._procs.append(
                subprocess.Popen(
                    [sys.executable, script, "node", str(i), ports, self._conf],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                )
            )

    def server_pids(self) -> Sequence[int]:
        return [p.pid for p in self._procs]

    def _send(self, i: int, obj: dict[str, Any]) -> None:
        stdin = self._procs[i].stdin
        if stdin is None:
            raise PsoError("node stdin not piped")
        stdin.write((json.dumps(obj) + "\n").encode())
        stdin.flush()

    def _recv(self, i: int) -> dict[str, Any]:
        stdout = self._procs[i].stdout
        if stdout is None:
            raise PsoError("node stdout not piped")
        line = stdout.readline()
        if not line:
            raise PsoError(f"PySyncObj node {i} exited ({self._procs[i].poll()})")
        msg: dict[str, Any] = json.loads(line)
        if "error" in msg:
            raise PsoError(f"PySyncObj node {i}: {msg['error']}")
        return msg

    def wait_ready(self) -> str:
        leaders = [self._recv(i)["leader"] for i in range(len(self._procs))]
        # Ask again until every member names the same leader.
        for _ in range(100):
            if len(set(leaders)) == 1 and leaders[0] is not None:
                self.leader = leaders[0]
                return str(leaders[0])
            time.sleep(0.1)
            leaders = []
            for i in range(len(self._procs)):
                self._send(i, {"op": "leader"})
                leaders.append(self._recv(i)["leader"])
        raise PsoError(f"PySyncObj members disagree on the leader: {leaders}")

    def run_level(
        self, *, clients: int, warmup_s: float, duration_s: float, value_size: int, prefix: str
    ) -> LevelResult:
        if self.leader is None:
            raise PsoError("run_level before wait_ready")
        n = len(self._procs)
        first = self.addrs.index(self.leader)
        assignment: list[list[int]] = [[] for _ in range(n)]
        for c in range(clients):
            assignment[(first + c) % n].append(c)
        window_start = time.monotonic() + 0.2 + warmup_s
        for i in range(n):
            self._send(i, {
                "op": "run", "clients": assignment[i], "window_start": window_start,
                "duration": duration_s, "value_size": value_size, "prefix": prefix,
            })
        meter = CpuMeter(self.server_pids())
        time.sleep(max(0.0, window_start - time.monotonic()))
        meter.start()
        time.sleep(duration_s)
        _, srv = meter.stop()
        lat_s: list[float] = []
        errors = 0
        notes: list[str] = []
        for i in range(n):
            msg = self._recv(i)
            lat_s.extend(us / 1e6 for us in msg["lat_us"])
            errors += int(msg["errors"])
            if msg["err"]:
                notes.append(str(msg["err"]))
        return summarise(
            system=self.name, clients=clients, latencies_s=lat_s, errors=errors,
            seconds=duration_s, loadgen_cpu=0.0, server_cpu=srv,
            note=notes[0] if notes else "",
        )

    def stop(self) -> None:
        for i, p in enumerate(self._procs):
            if p.poll() is None:
                with contextlib.suppress(OSError, PsoError):
                    self._send(i, {"op": "quit"})
        for p in self._procs:
            stop_process(p, grace_s=3.0)


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "node":
        sys.exit("usage: _pso.py node INDEX PORTS CONF_JSON (started by bench/kv.py)")
    sys.exit(_node_main(int(sys.argv[2]), [int(p) for p in sys.argv[3].split(",")], sys.argv[4]))
