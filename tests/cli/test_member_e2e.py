"""Membership of a running Raft cluster (issue 21, item 2), end to end on real node
processes with the `phalanx member` / `leader` commands in-process: a spare node laid out by
`cluster add-node` runs as a bootstrap learner outside the configuration; `member add` makes
it a learner (it catches up through a checkpoint: the others' logs were compacted),
`member promote` a voter through
joint consensus, the leader is moved onto it, another node is removed; every acknowledged
key stays readable, and the removed node is not ready (/ready answers 503).

The end-to-end test is long (`make sweeps`): four node processes and a dozen operations
take 13-23 s on a busy machine."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx import SyncClient
from phalanx.cli.main import main
from phalanx.ops.add_node import add_node
from phalanx.ops.local_cluster import NodeProcesses, find_free_base_port, init_cluster
from phalanx.ops.local_cluster import open_cluster as load_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int]]:
    directory = tmp_path_factory.mktemp("members") / "c"
    base = find_free_base_port(4)
    init_cluster(directory, nodes=3, base_port=base, checkpoint_every=20)
    spare = add_node(directory)  # n4, before the others start: no restart needed
    assert spare.id == "n4"
    assert spare.joined
    with NodeProcesses(load_cluster(directory)) as procs:
        procs.start()
        yield directory, base


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _member(capsys: pytest.CaptureFixture[str], cluster: Path,
            *argv: str) -> tuple[int, str, str]:
    return _cli(capsys, *argv, "--cluster", str(cluster), "--timeout", "20")


def _ready(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.mark.long
def test_add_promote_transfer_remove_keeps_every_acknowledged_key(
    cluster: tuple[Path, int], capsys: pytest.CaptureFixture[str]
) -> None:
    directory, base = cluster
    written: dict[str, bytes] = {}
    with SyncClient(directory, timeout=20) as client:

        def write(prefix: str, count: int) -> None:
            for i in range(count):
                key, value = f"{prefix}{i}", f"{prefix}-{i}".encode()
                client.put(key, value)
                written[key] = value

        write("before", 250)
        # Every node checkpointed (every 20 entries) and compacted its log to 100 entries
        # before its checkpoint: n4, empty, can only catch up through a checkpoint.
        code, out, err = _cli(capsys, "status", "--cluster", str(directory), "--json")
        checkpoints = {row["node"]: row["last_checkpoint"] for row in json.loads(out)
                       if row["node"] != "n4"}
        assert min(checkpoints.values()) > 120, checkpoints
        code, out, err = _member(capsys, directory, "member", "list")
        assert code == 0, err
        assert "n4" not in out  # laid out and running, but not a member yet
        code, _, err = _member(capsys, directory, "member", "add", "n4", "--as", "client")
        assert code == 6  # a read-write certificate may not change the membership
        assert "admin operations need role admin" in err
        code, out, err = _member(capsys, directory, "member", "add", "n4")
        assert code == 0, err
        assert "add n4: done" in out
        code, _, err = _member(capsys, directory, "member", "add", "n4")
        assert code == 3  # refused, one line, nothing changed
        assert "n4 is already a learner" in err
        write("learning", 20)
        deadline = time.monotonic() + 30
        while (code := _member(capsys, directory, "member", "promote", "n4")[0]) == 3:
            assert time.monotonic() < deadline, "n4 never caught up"  # refused until then
            time.sleep(0.3)
        assert code == 0
        code, out, _ = _member(capsys, directory, "member", "list")
        assert code == 0
        assert [line.split()[0] for line in out.splitlines()[1:5]] == ["n1", "n2", "n3", "n4"]
        assert "learner" not in out
        code, out, err = _member(capsys, directory, "leader", "transfer", "--to", "n4")
        assert code == 0, err
        assert out.startswith("n4 leads")
        write("promoted", 20)
        code, out, err = _member(capsys, directory, "member", "remove", "n1")
        assert code == 0, err
        assert "voters n2, n3, n4" in out
        write("removed", 20)
        for key, value in written.items():
            assert client.get(key) == value, key
    # n1 still runs outside the configuration: live, but not ready (it never hears the
    # final configuration, so it may only know that no leader talks to it any more)
    n1 = f"http://127.0.0.1:{base + 200}"
    assert _ready(f"{n1}/health") == (200, "ok\n")
    deadline = time.monotonic() + 10
    while _ready(f"{n1}/ready")[0] != 503:
        assert time.monotonic() < deadline, _ready(f"{n1}/ready")
        time.sleep(0.2)
    assert _ready(f"http://127.0.0.1:{base + 203}/ready") == (200, "ready\n")


def test_pbft_membership_is_static(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "p"
    init_cluster(directory, protocol="pbft", nodes=4, base_port=9000)
    code, _, err = _cli(capsys, "cluster", "add-node", str(directory))
    assert code == 2
    assert "protocol pbft has static membership" in err
