"""`stuck_resolution = "pbft"` on a real in-process cluster (`cluster init --protocol leaderless
--option stuck_resolution=pbft` configs, TLS sockets, Ed25519 keys; docs/LEADERLESS.md
"Ordered resolution"): with n4 never started, two clients race conflicting puts of one key;
whenever the endorsements split (neither reaches Q = 3 with three nodes up, and no abort
certificate forms), only the ordered checkpoint can end the pair: every call must end with
a definite outcome (committed or aborted), never a timeout, and at most one put commits.
The same test with ``stuck_resolution = "veto"`` fails (round 2 of the run measured: both
calls timed out): unanimity waits for n4. Marked long: ~14 s of wall time (rounds wait for
deadlines), the in-process tests (`test_leaderless_ordered_veto.py`) cover the rule fast."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from phalanx.client.async_client import open_client
from phalanx.client.errors import ClientTimeout, TransactionAborted
from phalanx.consensus.leaderless.core import LeaderlessCore
from phalanx.ops.local_cluster import find_free_base_port, init_cluster
from phalanx.ops.node_config import ClusterConfig, load_node_config
from phalanx.runtime.node import Node, open_node

GUARD = 90  # seconds: a hang guard only
ROUNDS = 6


@asynccontextmanager
async def running(cluster: ClusterConfig, ids: tuple[str, ...]) -> AsyncIterator[
        dict[str, Node]]:
    nodes: dict[str, Node] = {}
    async with trio.open_nursery() as nursery:
        for node_id in ids:
            async def run(task_status: trio.TaskStatus[Node], node_id: str = node_id) -> None:
                config = load_node_config(cluster.node_config_path(node_id))
                async with open_node(config, rng=random.Random(1)) as node:
                    task_status.started(node)
                    await trio.sleep_forever()
            nodes[node_id] = await nursery.start(run)
        try:
            yield nodes
        finally:
            nursery.cancel_scope.cancel()


@pytest.mark.long
def test_racing_puts_with_a_node_down_always_end(tmp_path: Path) -> None:
    cluster = init_cluster(tmp_path / "c", protocol="leaderless", nodes=4,
                           base_port=find_free_base_port(4),
                           protocol_options={"stuck_resolution": "pbft", "close_ticks": "50"})
    outcomes: list[tuple[int, str]] = []

    async def put(client: object, round_no: int, value: bytes) -> None:
        try:
            await client.put(f"k{round_no}", value, requirements={f"k{round_no}": b""})  # type: ignore[attr-defined]
            outcomes.append((round_no, "ok"))
        except TransactionAborted:
            outcomes.append((round_no, "aborted"))
        except ClientTimeout:
            outcomes.append((round_no, "timeout"))

    async def main() -> None:
        with trio.fail_after(GUARD):
            async with running(cluster, ("n1", "n2", "n3")) as c, \
                    open_client(cluster, timeout=2, abort_grace=6) as a, \
                    open_client(cluster, timeout=2, abort_grace=6) as b:
                for r in range(ROUNDS):
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(put, a, r, b"a")
                        nursery.start_soon(put, b, r, b"b")
                    if decisions(c) and r >= 1:
                        break
                assert decisions(c) > 0, outcomes  # some round split: a checkpoint decided

    def decisions(nodes: dict[str, Node]) -> int:
        total = 0
        for node in nodes.values():
            core = node.driver.core
            assert isinstance(core, LeaderlessCore)
            total += core._checkpoints.decisions  # type: ignore[union-attr]
        return total

    trio.run(main)
    assert all(kind != "timeout" for _, kind in outcomes), outcomes
    for r in {r for r, _ in outcomes}:
        assert sum(1 for q, kind in outcomes if q == r and kind == "ok") <= 1, outcomes
