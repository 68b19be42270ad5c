"""The toy protocol on a real 3-process cluster with the KV app, and through the `phalanx`
command line: nothing in the runtime, client, CLI or harness names it; the node processes
find it through ``PHALANX_PROTOCOLS`` (and ``PYTHONPATH`` naming ``tests/``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import trio

import toy_protocol
from phalanx.client import ClientError, open_client
from phalanx.client.async_client import Client
from phalanx.ops.local_cluster import NodeProcesses, find_free_base_port, init_cluster
from phalanx.ops.node_config import TimingConfig

TESTS = Path(toy_protocol.__file__).resolve().parent.parent


def plugin_env() -> dict[str, str]:
    """This environment, plus what makes a child process register the toy protocol."""
    path = os.pathsep.join(filter(None, (str(TESTS), os.environ.get("PYTHONPATH"))))
    return {**os.environ, "PHALANX_PROTOCOLS": "toy_protocol", "PYTHONPATH": path}


def phalanx(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "phalanx", *argv], capture_output=True,
                          text=True, timeout=timeout, check=False, env=plugin_env())


def test_cli_sim_runs_the_toy_protocol() -> None:
    done = phalanx("sim", "--protocol", "toy", "--seeds", "3", "--jobs", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    # Seeds alternate between 3 and 5 nodes (f = 1, 2).
    assert "toy, 3 nodes: 2 seeds, 2 passed, 0 failed" in done.stdout, done.stdout
    assert "toy, 5 nodes: 1 seed, 1 passed, 0 failed" in done.stdout, done.stdout
    assert "all: 3 seeds, 3 passed, 0 failed" in done.stdout, done.stdout


def test_cli_cluster_init_writes_a_toy_cluster(tmp_path: Path) -> None:
    done = phalanx("cluster", "init", str(tmp_path / "c"), "--protocol", "toy",
                   "--base-port", str(find_free_base_port(3)))
    assert done.returncode == 0, done.stderr
    assert "created toy cluster of 3 nodes" in done.stdout
    assert 'protocol = "toy"' in (tmp_path / "c" / "cluster.toml").read_text()


def test_cli_without_the_plugin_names_the_registered_protocols() -> None:
    done = subprocess.run([sys.executable, "-m", "phalanx", "sim", "--protocol", "toy"],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={k: v for k, v in os.environ.items() if k != "PHALANX_PROTOCOLS"})
    assert done.returncode == 2
    assert "'toy'" in done.stderr
    assert "raft" in done.stderr
    assert "pbft" in done.stderr


async def _role_and_commit(client: Client, node: str) -> tuple[str, int]:
    with trio.move_on_after(1):
        try:
            reply = await client.status(node)
        except ClientError:  # not up (yet)
            return "unreachable", -1
        return reply.role, reply.commit_index
    return "unreachable", -1


async def test_three_processes_write_read_kill_a_follower_restart_it(tmp_path: Path) -> None:
    cluster = init_cluster(tmp_path / "c", protocol="toy", nodes=3,
                           base_port=find_free_base_port(3),
                           timing=TimingConfig(tick_ms=10, heartbeat_ticks=3),
                           checkpoint_every=20)
    with NodeProcesses(cluster, env=plugin_env()) as procs:
        procs.start()
        try:
            async with open_client(cluster.directory, timeout=30) as client:
                for i in range(10):
                    await client.put(f"k{i}", f"v{i}".encode())
                assert await client.get("k3") == b"v3"
                roles = {n: (await _role_and_commit(client, n))[0] for n in procs.node_ids}
                assert roles == {"n1": "leader", "n2": "follower", "n3": "follower"}

                procs.kill("n3")  # a follower: the other two still form a majority
                # Past checkpoints (every 20) and the leader's in-memory tail below its
                # newest (toy_protocol.core.LOG_TAIL): n3 catches up from a snapshot.
                for i in range(10, 110):
                    await client.put(f"k{i}", f"v{i}".encode())
                assert await client.get("k42") == b"v42"
                assert await client.cas("k0", b"v0", b"new")

                procs.start(["n3"])
                leader_commit = (await _role_and_commit(client, "n1"))[1]
                for _ in range(300):  # it catches up (from a snapshot)
                    if (await _role_and_commit(client, "n3"))[1] >= leader_commit:
                        break
                    await trio.sleep(0.1)
                assert (await _role_and_commit(client, "n3")) >= ("follower", leader_commit)
                for i in range(110):
                    want = b"new" if i == 0 else f"v{i}".encode()
                    assert await client.get(f"k{i}") == want
                await client.put("after", b"restart")
                assert await client.get("after") == b"restart"
        except BaseException:
            for node in procs.node_ids:
                log = procs.log_path(node)
                if log.exists():
                    print(f"--- {node} ---\n{log.read_text()[-3000:]}")
            raise
        codes = procs.stop()
    assert codes == {"n1": 0, "n2": 0, "n3": 0}, codes
