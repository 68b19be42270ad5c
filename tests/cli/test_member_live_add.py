"""Adding a node to a RUNNING Raft cluster with no restart (issue 21, item 2's gap), end to end
on real node processes: while a client writes, `cluster add-node` lays out n4, n4 starts,
`member add` (the change carries n4's peer address: the running nodes link to it, mTLS
trusts its CA-signed certificate) and `member promote` make it a voter; then `member remove`
takes n3 out and the others drop its links. No node restarts (same pids), every
acknowledged write is read back, and n4 took part (it answers a status with its peers).

Long (`make sweeps`): four node processes, ~10-20 s on a busy machine."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx import SyncClient
from phalanx.cli.main import main
from phalanx.ops.add_node import add_node
from phalanx.ops.local_cluster import NodeProcesses, find_free_base_port, init_cluster
from phalanx.ops.local_cluster import open_cluster as load_cluster


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Path, NodeProcesses]]:
    directory = tmp_path / "c"
    init_cluster(directory, nodes=3, base_port=find_free_base_port(4), checkpoint_every=50)
    with NodeProcesses(load_cluster(directory)) as procs:
        procs.start()
        yield directory, procs


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _status(capsys: pytest.CaptureFixture[str], directory: Path) -> dict[str, dict[str, object]]:
    _code, out, _err = _cli(capsys, "status", "--cluster", str(directory), "--json")
    return {row["node"]: row for row in json.loads(out)}


class _Writer:
    """A client writing distinct keys in a thread; what was acknowledged."""

    def __init__(self, directory: Path) -> None:
        self.acked: dict[str, bytes] = {}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(directory,), daemon=True)
        self._thread.start()

    def _run(self, directory: Path) -> None:
        with SyncClient(directory, timeout=30) as client:
            i = 0
            while not self._stop.is_set():
                key, value = f"w{i}", f"v{i}".encode()
                try:
                    client.put(key, value)
                except Exception as e:
                    self.errors.append(f"{key}: {e}")
                else:
                    self.acked[key] = value
                i += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


@pytest.mark.long
def test_add_promote_remove_on_a_running_cluster_without_restarts(
    running: tuple[Path, NodeProcesses], capsys: pytest.CaptureFixture[str]
) -> None:
    directory, procs = running
    pids = {n: procs.pid(n) for n in procs.node_ids}
    member = ("--cluster", str(directory), "--timeout", "20")
    writer = _Writer(directory)
    try:
        deadline = time.monotonic() + 20
        while len(writer.acked) < 50:
            assert time.monotonic() < deadline, writer.errors[-3:]
            time.sleep(0.1)
        spare = add_node(directory)  # while the cluster runs; its nodes are not restarted
        assert spare.id == "n4"
        with NodeProcesses(load_cluster(directory)) as extra:
            extra.start(["n4"])
            code, out, err = _cli(capsys, "member", "add", "n4", *member)
            assert code == 0, err
            deadline = time.monotonic() + 30
            while (code := _cli(capsys, "member", "promote", "n4", *member)[0]) == 3:
                assert time.monotonic() < deadline, "n4 never caught up"
                time.sleep(0.3)
            assert code == 0
            # the old nodes linked to n4 (it votes now), in both directions
            deadline = time.monotonic() + 10
            while not all("n4" in row["connected_peers"] and row["node"] in
                          _status(capsys, directory)["n4"]["connected_peers"]
                          for name, row in _status(capsys, directory).items()
                          if name in ("n1", "n2", "n3")):
                assert time.monotonic() < deadline, _status(capsys, directory)
                time.sleep(0.2)
            acked_before_remove = len(writer.acked)
            code, out, err = _cli(capsys, "member", "remove", "n3", *member)
            assert code == 0, err
            assert "voters n1, n2, n4" in out
            deadline = time.monotonic() + 10
            while any("n3" in _status(capsys, directory)[name]["peers"]
                      for name in ("n1", "n2", "n4")):
                assert time.monotonic() < deadline, _status(capsys, directory)
                time.sleep(0.2)
            deadline = time.monotonic() + 20
            while len(writer.acked) < acked_before_remove + 50:
                assert time.monotonic() < deadline, writer.errors[-3:]
                time.sleep(0.1)
            writer.stop()
            assert {n: procs.pid(n) for n in procs.node_ids} == pids  # nobody restarted
            assert all(procs.running(n) for n in procs.node_ids)
            with SyncClient(directory, timeout=30) as client:
                for key, value in writer.acked.items():
                    assert client.get(key) == value, key
    finally:
        writer.stop()
