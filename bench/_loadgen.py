"""Closed-loop load generation and measurement shared by every system in `bench/kv.py`.

Owns: the `Target`/`Writer` protocols a system adapter implements, the closed-loop runner
(`run_level`), latency statistics, CPU accounting of the load generator and the server
processes, and small process helpers (free loopback ports, /proc readers, SIGTERM-then-SIGKILL
by recorded pid).

Must not import any system under test (phalanx, etcd, PySyncObj adapters import this module,
not the other way round). Loopback only: nothing here ever opens a non-loopback address.

Method (identical for every system driven from this process):
- C client tasks in one trio process; each does put after put (closed loop), unique keys
  `<prefix><client>-<seq>`, fixed-size values.
- A warmup period runs first; then a measurement window of `duration` seconds. An operation
  counts when it completes inside the window; its latency is its own start-to-ack time.
- Errors (exceptions from `Writer.put`) are counted, never retried silently: the writer
  implementation decides what a retry means for its system and the count is reported.
- CPU: the load generator's own process time and the summed utime+stime of the server pids
  over the window, both as a fraction of one core, so a reader can see whether the generator
  or the 2-core box is the bottleneck.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import trio

LOOPBACK = "127.0.0.1"


class Writer(Protocol):
    """One closed-loop client's handle on the system under test."""

    async def put(self, key: bytes, value: bytes) -> None: ...

    async def aclose(self) -> None: ...


class Target(Protocol):
    """A running system the load generator can drive."""

    name: str

    def server_pids(self) -> Sequence[int]: ...

    async def open_writer(self, index: int) -> Writer: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class LevelResult:
    """One (system, client count) measurement."""

    system: str
    clients: int
    ops: int
    errors: int
    seconds: float
    p50_ms: float
    p99_ms: float
    loadgen_cpu: float  # fraction of one core used by the load-generator process
    server_cpu: float  # fraction of one core, summed over the server processes
    note: str = ""

    @property
    def throughput(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else 0.0


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of an already sorted sequence; NaN if empty."""
    if not sorted_values:
        return math.nan
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


def summarise(
    *,
    system: str,
    clients: int,
    latencies_s: list[float],
    errors: int,
    seconds: float,
    loadgen_cpu: float,
    server_cpu: float,
    note: str = "",
) -> LevelResult:
    latencies_s.sort()
    return LevelResult(
        system=system,
        clients=clients,
        ops=len(latencies_s),
        errors=errors,
        seconds=seconds,
        p50_ms=percentile(latencies_s, 50) * 1e3,
        p99_ms=percentile(latencies_s, 99) * 1e3,
        loadgen_cpu=loadgen_cpu,
        server_cpu=server_cpu,
        note=note,
    )


# --------------------------------------------------------------------------------------------
# /proc helpers


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` in seconds (0.0 if the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return 0.0
    # The command name may contain spaces; fields after the closing parenthesis are fixed.
    fields = data[data.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def proc_rss_bytes(pid: int) -> int:
    """VmRSS of `pid` in bytes (0 if the process is gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


def proc_write_bytes(pid: int) -> int:
    """Bytes `pid` passed to write(2) and friends on files and pipes (`wchar` of
    /proc/PID/io; socket sends are not in it); 0 if unreadable."""
    try:
        with open(f"/proc/{pid}/io", encoding="ascii") as f:
            for line in f:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except OSError:
        return 0
    return 0


class CpuMeter:
    """CPU used by this process and by a set of pids between `start()` and `stop()`."""

    def __init__(self, pids: Sequence[int]) -> None:
        self._pids = tuple(pids)
        self._t0 = self._own0 = self._srv0 = 0.0

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._own0 = time.process_time()
        self._srv0 = sum(proc_cpu_seconds(p) for p in self._pids)

    def stop(self) -> tuple[float, float]:
        """(own, servers) as fractions of one core over the measured interval."""
        elapsed = max(time.perf_counter() - self._t0, 1e-9)
        own = (time.process_time() - self._own0) / elapsed
        srv = (sum(proc_cpu_seconds(p) for p in self._pids) - self._srv0) / elapsed
        return own, srv


def machine_info() -> str:
    load = os.getloadavg()
    return (
        f"{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
        f"{os.uname().sysname} {os.uname().release}, {fsync_probe()}"
    )


def fsync_probe(directory: str | None = None, rounds: int = 50) -> str:
    """The disk's append + fdatasync latency right now (p50 and p90 of `rounds` 100-byte
    appends in a temporary file): every fsync-bound figure of the run scales with it, and on
    a shared machine it moves by 10x within minutes."""
    import tempfile

    samples: list[float] = []
    with tempfile.NamedTemporaryFile(dir=directory, prefix="fsync-probe-") as f:
        fd = f.fileno()
        for _ in range(rounds):
            t0 = time.perf_counter()
            os.write(fd, b"x" * 100)
            os.fdatasync(fd)
            samples.append(time.perf_counter() - t0)
    samples.sort()
    return (f"append+fdatasync p50 {samples[len(samples) // 2] * 1e3:.2f} ms "
            f"p90 {samples[len(samples) * 9 // 10] * 1e3:.2f} ms")


def start_profilers(
    pids: Sequence[int], prefix: str, seconds: float
) -> list[subprocess.Popen[bytes]]:
    """py-spy (raw collapsed stacks, 100 Hz) of every pid for `seconds`, into
    `<prefix>-<pid>.txt`; nothing when py-spy is not installed next to the interpreter or
    on PATH."""
    import shutil
    import sys
    from pathlib import Path

    local = Path(sys.executable).parent / "py-spy"
    spy = str(local) if local.exists() else shutil.which("py-spy")
    if spy is None:
        return []
    return [
        subprocess.Popen(
            [spy, "record", "-r", "100", "-d", str(max(1, round(seconds))), "-f", "raw",
             "-o", f"{prefix}-{pid}.txt", "--pid", str(pid)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        for pid in pids
    ]


# --------------------------------------------------------------------------------------------
# Process and port helpers


def stop_process(proc: subprocess.Popen[bytes], *, grace_s: float = 5.0) -> None:
    """SIGTERM the process we started (by its pid), then SIGKILL it if it lingers."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(timeout=grace_s)


# --------------------------------------------------------------------------------------------
# The closed loop


def make_value(size: int) -> bytes:
    """A fixed value of `size` bytes (printable, so every system stores it verbatim)."""
    pattern = b"0123456789abcdefghijklmnopqrstuvwxyz"
    return (pattern * (size // len(pattern) + 1))[:size]


async def run_level(
    target: Target,
    *,
    clients: int,
    warmup_s: float,
    duration_s: float,
    value: bytes,
    key_prefix: str,
    grace_s: float = 5.0,
) -> LevelResult:
    """Drive `target` with `clients` closed-loop writers and measure the window."""
    if clients < 1 or duration_s <= 0 or warmup_s < 0:
        raise ValueError("run_level: clients >= 1, duration > 0 and warmup >= 0 required")
    writers = [await target.open_writer(i) for i in range(clients)]
    latencies: list[float] = []
    errors = [0]
    last_error: list[str] = []
    window = [math.inf, math.inf]  # [start, end], perf_counter seconds
    stop = trio.Event()
    running = [clients]
    all_done = trio.Event()
    perf = time.perf_counter

    async def client(index: int, writer: Writer) -> None:
        prefix = f"{key_prefix}{index}-".encode()
        record = latencies.append
        try:
            await _loop(writer, prefix, record)
        finally:
            running[0] -= 1
            if running[0] == 0:
                all_done.set()

    async def _loop(writer: Writer, prefix: bytes, record: Callable[[float], None]) -> None:
        seq = 0
        while not stop.is_set():
            key = prefix + str(seq).encode()
            seq += 1
            t0 = perf()
            try:
                await writer.put(key, value)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, RuntimeError,
                    ValueError, TimeoutError) as e:
                t1 = perf()
                if window[0] <= t1 <= window[1]:
                    errors[0] += 1
                    if not last_error:
                        last_error.append(f"{type(e).__name__}: {e}")
                await trio.sleep(0.01)
                continue
            t1 = perf()
            if window[0] <= t1 <= window[1]:
                record(t1 - t0)

    meter = CpuMeter(target.server_pids())
    try:
        async with trio.open_nursery() as nursery:
            for i, w in enumerate(writers):
                nursery.start_soon(client, i, w)
            await trio.sleep(warmup_s)
            meter.start()
            window[0] = perf()
            window[1] = window[0] + duration_s
            await trio.sleep(duration_s)
            own, srv = meter.stop()
            stop.set()
            with trio.move_on_after(grace_s):
                # Let in-flight operations finish so connections stay in a clean state.
                await all_done.wait()
            nursery.cancel_scope.cancel()
    finally:
        for w in writers:
            with contextlib.suppress(Exception):
                await w.aclose()
    return summarise(
        system=target.name,
        clients=clients,
        latencies_s=latencies,
        errors=errors[0],
        seconds=duration_s,
        loadgen_cpu=own,
        server_cpu=srv,
        note=last_error[0] if last_error else "",
    )
