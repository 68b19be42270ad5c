"""Node processes of a local cluster: start, signal, stop and supervise them, with pid files
that never lie about a live node.

Owns:
    * `NodeProcesses`: node subprocesses of one cluster (start, signal, stop with a grace
      period, restart), each logging to ``DIR/logs/<id>.log`` and recording its pid in
      ``DIR/run/<id>.pid`` while it runs. `phalanx cluster up`, the demos, the harness and
      the tests share it.
    * `live_pid(path)`: the process a pid file names, if it is still that process.
    * `supervise`: `cluster up`'s foreground loop (the command line is
      `phalanx.ops.cluster_command`).
    * `ClusterError`: an operator-fixable problem with a cluster directory or its processes
      (the CLI prints it as one line, exit status 2; `phalanx.ops.local_cluster` re-exports it).

Rules (issue 21, "safe cluster up"):
    * A pid file is written after its process started and removed only by the
      `NodeProcesses` that wrote it, and only while it still holds that process's pid: a
      second `cluster up`, or `cluster up --node N` restarting a node another supervisor
      lost, never deletes a live node's pid file.
    * `start` refuses (ClusterError, before starting any node) a node whose pid file names a
      live process: two processes of one node would fight over its data directory and ports.
      A pid file naming a dead process, or a process started after the file was written (the
      pid was reused), is stale and is replaced.
    * A clean stop is SIGTERM, then SIGKILL for nodes still running after the grace period.
    * Never imports the runtime or the client: nodes are separate processes started as
      ``python -m phalanx node run CONFIG``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any, Final

from phalanx.cli.errors import OperatorError
from phalanx.ops.node_config import ClusterConfig

DEFAULT_GRACE: Final = 10.0
START_TIME_SLACK: Final = 2.0
"""Seconds a process may seem to have started after its pid file was written (clock
granularity of /proc's start time and the file system's mtime) and still be the one the file
names."""


class ClusterError(OperatorError):
    """An operator-fixable problem with a cluster directory or its processes."""


def _process_start(pid: int) -> float | None:
    """When process `pid` started (seconds since the epoch), from Linux's /proc: None where
    there is no /proc or the process is gone, -1.0 for a zombie (exited, not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(line for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
    except (OSError, StopIteration):
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
    if fields[0] == "Z":
        return -1.0
    ticks = int(fields[19])  # field 22 of stat: starttime, in clock ticks since boot
    return int(boot.split()[1]) + ticks / os.sysconf("SC_CLK_TCK")


def live_pid(path: Path) -> int | None:
    """The pid in pid file `path` if that process is alive and is the one the file was
    written for; None for no file, an unreadable one, a dead or zombie process, or a pid
    reused by a process that started after the file was written (Linux; elsewhere a live
    pid is trusted)."""
    try:
        text = path.read_text()
        written = path.stat().st_mtime
        pid = int(text.strip())
    except (OSError, ValueError):
        return None
    if pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, owned by someone else
    started = _process_start(pid)
    if started is not None and (started < 0 or started > written + START_TIME_SLACK):
        return None  # a zombie, or the pid now names a younger process
    return pid


# --------------------------------------------------------------------------------------------
# Node processes


def node_command(config_path: Path) -> list[str]:
    """The argv that runs one node in the foreground."""
    return [sys.executable, "-m", "phalanx", "node", "run", str(config_path)]


@dataclass(slots=True)
class _Running:
    process: subprocess.Popen[bytes]
    log: IO[bytes]
    started: float


class NodeProcesses:
    """The node subprocesses of one cluster directory.

    `command` maps a node's config path to the argv that runs it (default `node_command`).
    Each node runs in its own session (so a terminal's Ctrl-C reaches only the supervisor,
    which then stops the nodes in order), appends stdout and stderr to ``logs/<id>.log`` and
    has its pid in ``run/<id>.pid`` while running. Not thread-safe.
    """

    def __init__(
        self,
        cluster: ClusterConfig,
        *,
        env: dict[str, str] | None = None,
        command: Callable[[Path], list[str]] = node_command,
    ) -> None:
        self.cluster = cluster
        self._env = env
        self._command = command
        self._running: dict[str, _Running] = {}
        self._ids = tuple(n.id for n in cluster.nodes)

    @property
    def node_ids(self) -> tuple[str, ...]:
        return self._ids

    def log_path(self, node_id: str) -> Path:
        return self.cluster.directory / "logs" / f"{node_id}.log"

    def pid_path(self, node_id: str) -> Path:
        return self.cluster.directory / "run" / f"{node_id}.pid"

    def _check(self, node_id: str) -> None:
        if node_id not in self._ids:
            raise ValueError(f"no node {node_id!r} in {self.cluster.directory}")

    def live_elsewhere(self, node_ids: Sequence[str] | None = None) -> dict[str, int]:
        """The given nodes (default: all) that run in a process this object did not start,
        by their pid files (`live_pid`): node id -> pid."""
        out: dict[str, int] = {}
        for node_id in node_ids if node_ids is not None else self._ids:
            self._check(node_id)
            if self.running(node_id):
                continue
            pid = live_pid(self.pid_path(node_id))
            if pid is not None:
                out[node_id] = pid
        return out

    def start(self, node_ids: Sequence[str] | None = None) -> None:
        """Start the given nodes (default: all); a node already running here is left alone.

        Raises:
            ClusterError: before starting any, when one of them runs in another process
                (its pid file names a live process: `live_elsewhere`).
        """
        wanted = list(node_ids if node_ids is not None else self._ids)
        elsewhere = self.live_elsewhere(wanted)
        if elsewhere:
            node_id, pid = next(iter(elsewhere.items()))
            raise ClusterError(
                f"node {node_id} is already running (pid {pid}, {self.pid_path(node_id)}); "
                f"stop it first (kill {pid}) or leave it out (--node selects the nodes to run)")
        for node_id in wanted:
            if self.running(node_id):
                continue
            self._reap(node_id)
            log_path = self.log_path(node_id)
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log = log_path.open("ab")
            cmd = self._command(self.cluster.node_config_path(node_id))
            process = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, env=self._env, cwd=self.cluster.directory,
            )
            self._running[node_id] = _Running(process=process, log=log, started=time.monotonic())
            pid_path = self.pid_path(node_id)
            pid_path.parent.mkdir(parents=True, exist_ok=True)
            staging = pid_path.with_name(f".{pid_path.name}.{process.pid}")
            staging.write_text(f"{process.pid}\n")
            os.replace(staging, pid_path)  # never a half-written pid file

    def running(self, node_id: str) -> bool:
        r = self._running.get(node_id)
        return r is not None and r.process.poll() is None

    def pid(self, node_id: str) -> int | None:
        r = self._running.get(node_id)
        return r.process.pid if r is not None and r.process.poll() is None else None

    def exited(self) -> dict[str, int]:
        """Nodes started by us that have exited since, with their return codes (negative:
        killed by that signal). Reaps them."""
        out: dict[str, int] = {}
        for node_id in self._ids:
            r = self._running.get(node_id)
            if r is not None and (code := r.process.poll()) is not None:
                out[node_id] = code
                self._reap(node_id)
        return out

    def signal(self, node_id: str, signum: int) -> None:
        """Send `signum` to a running node (SIGKILL: crash it)."""
        self._check(node_id)
        r = self._running.get(node_id)
        if r is None or r.process.poll() is not None:
            raise ClusterError(f"node {node_id} is not running")
        r.process.send_signal(signum)

    def kill(self, node_id: str) -> int:
        """SIGKILL a running node and wait for it; returns its return code."""
        self.signal(node_id, signal.SIGKILL)
        r = self._running[node_id]
        code = r.process.wait()
        self._reap(node_id)
        return code

    def stop(self, *, grace: float = DEFAULT_GRACE) -> dict[str, int]:
        """SIGTERM every running node, SIGKILL those still running after `grace` seconds.

        Returns each stopped node's return code (0 for a clean shutdown).
        """
        live = {i: r for i, r in self._running.items() if r.process.poll() is None}
        for r in live.values():
            with contextlib.suppress(ProcessLookupError):
                r.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        codes: dict[str, int] = {}
        for node_id, r in live.items():
            try:
                codes[node_id] = r.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                r.process.kill()
                codes[node_id] = r.process.wait()
        for node_id in list(self._running):
            if node_id not in codes and (code := self._running[node_id].process.poll()) is not None:
                codes[node_id] = code
            self._reap(node_id)
        return codes

    def _reap(self, node_id: str) -> None:
        r = self._running.pop(node_id, None)
        if r is None:
            return
        r.log.close()
        path = self.pid_path(node_id)
        with contextlib.suppress(OSError, ValueError):
            if int(path.read_text().strip()) == r.process.pid:  # not another's live node
                path.unlink()

    def __enter__(self) -> NodeProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------------------------
# Command line

def supervise(procs: NodeProcesses, node_ids: Sequence[str], *, grace: float) -> int:
    """Run `node_ids` until SIGINT/SIGTERM or until all of them exit; see `cluster up`."""
    stop_requested: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop_requested.append(signum)

    previous: dict[int, Any] = {
        s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        procs.start(node_ids)
        for node_id in node_ids:
            print(f"{node_id}: pid {procs.pid(node_id)}, log {procs.log_path(node_id)}",
                  flush=True)
        print("cluster up; Ctrl-C stops it", flush=True)
        failed = False
        alive = set(node_ids)
        while alive and not stop_requested:
            for node_id, code in procs.exited().items():
                alive.discard(node_id)
                failed = True
                print(f"{node_id} exited with status {code}; see {procs.log_path(node_id)}",
                      file=sys.stderr, flush=True)
            time.sleep(0.1)
        if not stop_requested:
            return 1
        print("stopping nodes", flush=True)
        codes = procs.stop(grace=grace)
        for node_id, code in sorted(codes.items()):
            if code != 0:
                failed = True
                print(f"{node_id} stopped with status {code}", file=sys.stderr, flush=True)
        return 1 if failed else 0
    finally:
        procs.stop(grace=grace)
        for s, handler in previous.items():
            signal.signal(s, handler)
