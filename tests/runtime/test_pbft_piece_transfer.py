"""PBFT state transfer with pieces (`phalanx.runtime.piece_carrier`) on an in-process 4-node
cluster: a backup whose data directory was wiped while the others moved several stable
checkpoints on gets `CheckpointData` carrying a piece manifest, fetches the pieces from its
peers (each checked by its SHA-256), and its core checks the assembled bytes against the
stable checkpoint's certificate before installing them; then it executes with the others.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import trio
from test_pbft_cluster import GUARD, make_pbft_cluster, running

from phalanx.apps import kv_wire
from phalanx.apps.kv_types import Get, Value
from phalanx.client.async_client import open_client


@pytest.mark.long  # 17 s, ~65 s on a loaded 2-core machine (200 PBFT writes): `make sweeps`
def test_wiped_backup_catches_up_by_fetching_pieces(tmp_path: Path) -> None:
    cluster = make_pbft_cluster(tmp_path)

    async def main() -> None:
        with trio.fail_after(GUARD * 2):
            async with running(cluster) as c, open_client(cluster, timeout=20) as client:
                await client.put("first", b"1")
                c.stop("n4")
                await trio.sleep(0.2)  # its storage closes
                shutil.rmtree(c.configs["n4"].data_dir)
                for i in range(200):  # > 2 checkpoint intervals (64) of batches
                    await client.put(f"k{i:03d}", b"v%d" % i * 50)
                await c.start("n4")
                node = c.nodes["n4"]
                others = [n for k, n in c.nodes.items() if k != "n4"]
                target = min(n.driver.applied_index for n in others)
                while node.driver.applied_index < target:
                    await client.put("tick", b"x")  # keeps checkpoints and batches coming
                    await trio.sleep(0.05)
                assert node.pieces is not None
                stats = node.pieces.stats
                assert stats.resolves >= 1, stats
                assert stats.fetched_bytes > 0, stats
                assert sum(n.pieces.stats.served_bytes for n in others
                           if n.pieces is not None) >= stats.fetched_bytes
                got = node.replica.query(kv_wire.encode_command(Get(key="k150")))
                assert kv_wire.decode_result(got) == Value(value=b"v150" * 50)

    trio.run(main)
