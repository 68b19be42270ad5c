"""phalanx side of `bench/kv.py`: a 3-node cluster of real processes and the client adapter.

Owns: making a cluster directory (`phalanx.ops.local_cluster.init_cluster`, fsync "group", default
timing), running one node process per node (`python -m phalanx node run CONFIG`, or this
file's own `node` mode when the CLI subcommand is not wired yet; both call
`phalanx.runtime.node.serve_node` with the same config), one shared `phalanx.client.Client` for all
closed-loop writers (it pipelines any number of concurrent calls over one TLS connection per
node), leader failover trials and the RSS-at-N-keys phase.

Must not be imported by the package. Loopback only (`init_cluster` binds 127.0.0.1).
Invariant: every process started here is stopped through `NodeProcesses` by its pid.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import trio
from _failover import failover_trial
from _loadgen import Writer, make_value, proc_rss_bytes

from phalanx.apps.kv_types import Put
from phalanx.client.async_client import Client, ClientError, open_client
from phalanx.ops.local_cluster import (
    ClusterError,
    NodeProcesses,
    find_free_base_port,
    init_cluster,
    node_command,
)
from phalanx.ops.node_config import ClusterConfig, load_node_config

CHECKPOINT_QUIET_S = 17.0
"""RSS phase: seconds without a finished checkpoint on any node before the RSS counts as
settled (a node trims its heap 3 s and 15 s after a checkpoint;
`phalanx.runtime.process_tuning.TrimPolicy`)."""

Log = Callable[[str], None]


class PhalanxUnavailable(RuntimeError):
    """The phalanx cluster could not be set up or stopped answering."""


class PhalanxPutError(RuntimeError):
    """A put failed (wraps `phalanx.client.ClientError` for the load generator's count)."""


def _cli_has_node_run() -> bool:
    out = subprocess.run(
        [sys.executable, "-m", "phalanx", "node", "run", "--help"],
        capture_output=True, check=False, timeout=60,
    )
    return out.returncode == 0


def _bench_node_command(config_path: Path) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "node", str(config_path)]


def _profiled_command(node_id: str, config_path_of: Callable[[str], Path], prefix: Path,
                      command: Callable[[Path], list[str]] | None
                      ) -> Callable[[Path], list[str]]:
    """The node command, with `node_id` wrapped in `python -m cProfile -o PREFIX<id>.prof`."""
    base = command or node_command
    target = config_path_of(node_id)
    prefix.parent.mkdir(parents=True, exist_ok=True)

    def make(config_path: Path) -> list[str]:
        argv = base(config_path)
        if config_path != target:
            return argv
        return [argv[0], "-m", "cProfile", "-o", f"{prefix}{node_id}.prof", *argv[1:]]

    return make


class _SharedClientWriter:
    def __init__(self, client: Client) -> None:
        self._client = client

    async def put(self, key: bytes, value: bytes) -> None:
        try:
            await self._client.put(key.decode(), value)
        except ClientError as e:
            raise PhalanxPutError(f"{type(e).__name__}: {e}") from None

    async def aclose(self) -> None:
        return None


class PhalanxCluster:
    """Three phalanx node processes on loopback plus one shared client."""

    name = "phalanx"

    def __init__(self, *, protocol: str, workdir: str | None, nodes: int = 3,
                 checkpoint_every_bytes: int | None = None, fsync: str = "group",
                 cprofile: str | None = None) -> None:
        """`cprofile`: a directory; the first node then runs under cProfile and dumps its
        stats there on a clean stop (`<protocol>-<node>.prof`; read with `pstats`)."""
        self._own_dir = workdir is None
        parent = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="phalanx-bench-"))
        self.directory = parent / f"cluster-{protocol}"
        try:
            self.config: ClusterConfig = init_cluster(
                self.directory, protocol=protocol, nodes=nodes,
                base_port=find_free_base_port(nodes), fsync=fsync,
            )
        except ClusterError as e:
            raise PhalanxUnavailable(f"cluster init failed: {e}") from None
        if checkpoint_every_bytes is not None:
            for node in self.config.nodes:
                path = self.config.node_config_path(node.id)
                text, count = re.subn(r"(?m)^every_bytes = \d+$",
                                      f"every_bytes = {checkpoint_every_bytes}",
                                      path.read_text())
                if count != 1:
                    raise PhalanxUnavailable(f"{path}: no [checkpoint] every_bytes to override")
                path.write_text(text)
        command = None if _cli_has_node_run() else _bench_node_command
        if cprofile is not None:
            command = _profiled_command(self.config.nodes[0].id, self.config.node_config_path,
                                        Path(cprofile) / f"{protocol}-", command)
        self.runner = "phalanx node run" if command is None else "bench/_phalanx.py node"
        self.procs = (
            NodeProcesses(self.config) if command is None
            else NodeProcesses(self.config, command=command)
        )
        self._client: Client | None = None

    def start(self) -> None:
        self.procs.start()

    def stop(self) -> None:
        self.procs.stop(grace=10.0)
        if self._own_dir:
            shutil.rmtree(self.directory.parent, ignore_errors=True)

    def server_pids(self) -> Sequence[int]:
        return [p for n in self.procs.node_ids if (p := self.procs.pid(n)) is not None]

    @property
    def client(self) -> Client:
        if self._client is None:
            raise RuntimeError("PhalanxCluster.client outside `connected()`")
        return self._client

    @asynccontextmanager
    async def connected(self) -> AsyncIterator[Client]:
        async with open_client(self.config) as client:
            self._client = client
            try:
                yield client
            finally:
                self._client = None

    async def open_writer(self, index: int) -> Writer:
        return _SharedClientWriter(self.client)

    async def diagnostics(self) -> dict[str, float]:
        """Client counters and the nodes' driver/Raft counters (scraped from their metrics
        endpoints), summed over nodes; `bench/kv.py` prints their change over each level."""
        out: dict[str, float] = {}
        if self._client is not None:
            stats = self._client.statistics()
            for name in ("retries", "redirects", "timeouts", "patient_waits", "probes",
                         "connection_failures"):
                out[f"client_{name}"] = float(getattr(stats, name))
        scraped = await trio.to_thread.run_sync(self._scrape)
        for name, value in scraped.items():
            out[name] = out.get(name, 0.0) + value
        return out

    def _scrape(self) -> dict[str, float]:
        return self.scrape(("elections", "leader_changes", "peer_queue_drops",
                            "driver_client_redirects", "driver_client_retries",
                            "driver_duplicate_calls", "driver_overloaded_calls",
                            "driver_slow_passes", "peer_bytes_out"))

    def scrape(self, wanted: Sequence[str]) -> dict[str, float]:
        """The nodes' metrics named in `wanted` (without the `phalanx_` prefix and `_total`
        suffix; a histogram's `<name>_count`), summed over the running nodes. Blocking."""
        sums: dict[str, float] = {}
        for node in self.procs.node_ids:
            listen = load_node_config(self.config.node_config_path(node)).metrics_listen
            if listen is None or self.procs.pid(node) is None:
                continue
            try:
                with urllib.request.urlopen(
                        f"http://{listen.host}:{listen.port}/metrics", timeout=2) as reply:
                    text = reply.read().decode()
            except OSError:
                continue
            for line in text.splitlines():
                if not line.startswith("phalanx_") or "_created" in line:
                    continue
                name = line.split("{", 1)[0].removeprefix("phalanx_").removesuffix("_total")
                if name in wanted:
                    sums[name] = sums.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return sums

    def _check_alive(self) -> None:
        dead = self.procs.exited()
        if dead:
            logs = {n: self.procs.log_path(n) for n in dead}
            tails = "; ".join(
                f"{n} exited {code}: "
                + (logs[n].read_text(errors="replace")[-800:] if logs[n].exists() else "")
                for n, code in dead.items()
            )
            raise PhalanxUnavailable(tails)

    async def leader(self) -> str | None:
        """The node every running node names as leader, if they agree."""
        named: set[str] = set()
        for node in self.procs.node_ids:
            if self.procs.pid(node) is None:
                continue
            try:
                with trio.move_on_after(1.0) as scope:
                    reply = await self.client.status(node)
            except ClientError:
                return None
            if scope.cancelled_caught or reply.leader is None:
                return None
            named.add(reply.leader)
        return named.pop() if len(named) == 1 else None

    async def wait_ready(self, timeout_s: float = 60.0) -> str:
        """Wait for an agreed leader and one acknowledged write; return the leader id."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._check_alive()
            lead = await self.leader()
            if lead is not None:
                try:
                    with trio.fail_after(5):
                        await self.client.put("bench-ready", b"1")
                    return lead
                except (ClientError, trio.TooSlowError):
                    pass
            await trio.sleep(0.1)
        raise PhalanxUnavailable(f"no leader / no acknowledged write after {timeout_s} s")


async def phalanx_failover(cluster: PhalanxCluster, *, trials: int, log: Log) -> list[float]:
    """SIGKILL the leader `trials` times (restarting it in between); seconds per trial."""
    times: list[float] = []
    writer = _SharedClientWriter(cluster.client)
    for trial in range(trials):
        leader = await cluster.wait_ready()

        def kill(node: str = leader) -> None:
            cluster.procs.kill(node)

        took = await failover_trial(writer.put, kill, prefix=f"fo{trial}-")
        log(f"phalanx failover trial {trial + 1}: killed {leader}, first ack after "
            f"{took * 1e3:.0f} ms")
        times.append(took)
        cluster.procs.start([leader])
    await cluster.wait_ready()
    return times


async def phalanx_rss(
    cluster: PhalanxCluster,
    *,
    keys: int,
    value_size: int,
    log: Log,
    budget_s: float,
    concurrency: int = 256,
    batch: int = 1,
    settle_s: float = 90.0,
) -> dict[str, float]:
    """Load `keys` distinct keys through the client (pipelined), let the nodes settle, then
    read every node's RSS (`max_rss`: the settled figure; `peak_rss`: the highest seen).

    With `batch` > 1 each command is a `Txn` of `batch` puts (no compares), so the load is
    `batch` times fewer requests for the same state: the RSS measures memory per key, and
    one put per request would only measure how long the load takes (~1M keys need ~20 min
    at the 1 k writes/s a shared 2-core box gives).

    The load uses its own client with a long per-call deadline: a bulk load with hundreds of
    writes queued may legitimately take longer than the interactive 5 s default, and a
    timed-out put is simply retried (same key and value, so the state is the same either way).
    Loading stops taking new keys after `budget_s`; the result then reports the keys loaded.
    """
    value = make_value(value_size)
    width = len(str(keys - 1))
    next_key = [0]
    raw = [0]
    errors = [0]
    max_errors = max(1000, keys // 10)
    report_every = max(1, keys // 10)
    t0 = time.perf_counter()

    done = [0]
    peak_rss = [0.0]
    deadline = t0 + budget_s

    async def loader(client: Client) -> None:
        while next_key[0] < keys and time.perf_counter() < deadline:
            first = next_key[0]
            count = min(batch, keys - first)
            next_key[0] += count
            names = [f"k{i:0{width}d}" for i in range(first, first + count)]
            while True:
                try:
                    if count == 1:
                        await client.put(names[0], value)
                    else:
                        await client.txn((), [Put(key=k, value=value) for k in names])
                    break
                except ClientError:
                    errors[0] += 1
                    if errors[0] > max_errors:
                        raise PhalanxUnavailable(
                            f"RSS load: over {max_errors} failed puts"
                        ) from None
                    await trio.sleep(0.05)
            raw[0] += sum(len(k.encode()) + len(value) for k in names)
            done[0] += count
            if first // report_every != (first + count) // report_every:
                i = first + count
                rate = i / (time.perf_counter() - t0)
                rss = max((proc_rss_bytes(p) for p in cluster.server_pids()), default=0)
                peak_rss[0] = max(peak_rss[0], float(rss))
                log(f"  RSS load: {i:,} keys ({rate:,.0f}/s), max node RSS {rss / 2**20:,.0f} MiB")

    log(f"phalanx: loading {keys:,} keys with {concurrency} pipelined writers "
        f"({batch} per command) for the RSS phase")
    async with open_client(cluster.config, timeout=60.0) as client, trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(loader, client)
    load_s = time.perf_counter() - t0
    if done[0] < keys:
        log(f"  RSS load: budget of {budget_s:g} s reached after {done[0]:,} of {keys:,} keys")
    # Settle: the last checkpoint of the load is usually still being written, and its fold
    # coexists with the layers it replaces until the nodes' idle housekeeping frees them.
    # Sample every second until no node has finished a checkpoint for CHECKPOINT_QUIET_S and
    # the largest node RSS has moved less than 1% over three samples (or `settle_s` passed);
    # the verdict uses that settled figure, and the peak seen during the load and the
    # settling is reported beside it.
    def sample() -> dict[str, float]:
        return {f"rss_{node}": float(proc_rss_bytes(pid)) if (pid := cluster.procs.pid(node))
                is not None else math.nan for node in cluster.procs.node_ids}

    settle_t0 = time.perf_counter()
    history: list[float] = []
    peak = peak_rss[0]
    checkpoints: tuple[int, ...] = ()
    checkpoints_since = settle_t0
    async with open_client(cluster.config, timeout=5.0) as status_client:
        while True:
            await trio.sleep(1.0)
            current = sample()
            top = max(current.values())
            peak = max(peak, top)
            history.append(top)
            now = time.perf_counter()
            # A checkpoint still being written (seconds for a million keys) leaves the RSS
            # flat until its fold replaces the base; the node trims its heap a few seconds
            # after. So: settled = no node finished a checkpoint for CHECKPOINT_QUIET_S, and
            # the RSS moved < 1% over three samples.
            try:
                latest = tuple([(await status_client.status(node)).last_checkpoint
                                for node in cluster.procs.node_ids])
            except ClientError:
                latest = ()
            if latest != checkpoints:
                checkpoints, checkpoints_since = latest, now
            recent = history[-3:]
            if (now - checkpoints_since >= CHECKPOINT_QUIET_S and len(recent) == 3
                    and max(recent) - min(recent) < 0.01 * max(recent)):
                break
            if now - settle_t0 >= settle_s:
                break
    out: dict[str, float] = {
        "keys": float(done[0]), "target_keys": float(keys), "raw_bytes": float(raw[0]),
        "load_s": load_s,
        "load_errors": float(errors[0]),
        "settle_s": time.perf_counter() - settle_t0,
        **current,
    }
    out["max_rss"] = max(v for k, v in out.items() if k.startswith("rss_"))
    out["peak_rss"] = max(peak, out["max_rss"])
    return out


# --------------------------------------------------------------------------------------------
# Fallback node runner (used only while `phalanx node run` is not wired into the CLI)


def _node_main(config_path: str) -> int:
    import signal

    from phalanx.ops.node_config import load_node_config
    from phalanx.runtime.node import serve_node

    config = load_node_config(config_path)

    async def run() -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                await nursery.start(serve_node, config)
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    break

    trio.run(run)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "node":
        sys.exit("usage: _phalanx.py node CONFIG (started by bench/kv.py)")
    sys.exit(_node_main(sys.argv[2]))
