"""Backup and restore (issue 21, item 4) end to end on real node processes, for every
protocol whose registry entry runs a cluster here (Raft, PBFT): keys written, `phalanx
snapshot save` while the cluster runs, `phalanx snapshot restore --into` a new directory, the
new cluster started, and every key acknowledged before the save read back from it. The new
cluster has a new CA (a new identity). Long (`make
sweeps`); tests/runtime/test_backup_runtime.py runs the same with the nodes in-process."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx import SyncClient
from phalanx.cli.main import main
from phalanx.ops.backup_file import read_backup
from phalanx.ops.local_cluster import NodeProcesses, find_free_base_port, init_cluster
from phalanx.ops.local_cluster import open_cluster as load_cluster
from phalanx.runtime.identity import cluster_fingerprint


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(params=["raft", "pbft"])
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.long  # two clusters of real processes: 12-15 s each (in-process and fast:
# tests/runtime/test_backup_runtime.py)
def test_restored_cluster_holds_every_key_acknowledged_before_the_save(
        tmp_path: Path, protocol: str, capsys: pytest.CaptureFixture[str]) -> None:
    old = tmp_path / "old"
    nodes = 4 if protocol == "pbft" else 3
    init_cluster(old, protocol=protocol, nodes=nodes, base_port=find_free_base_port(nodes),
                 checkpoint_every=16)
    backup = tmp_path / "c.phx"
    written: dict[str, bytes] = {}
    with NodeProcesses(load_cluster(old)) as procs:
        procs.start()
        with SyncClient(old, timeout=20) as client:
            for i in range(40):
                key, value = f"k{i}", f"v{i}".encode()
                client.put(key, value)
                written[key] = value
            code, out, err = _cli(capsys, "snapshot", "save", "--cluster", str(old),
                                  str(backup))
            assert code == 0, err
            assert out.startswith(f"saved {backup}: index ")
            client.put("after", b"not in the backup")
    header, _ = read_backup(backup)
    assert header.protocol == protocol
    assert header.app == "kv"
    assert len(header.voters) == nodes
    assert header.cluster == cluster_fingerprint(old / "ca" / "ca.pem")

    new = tmp_path / "new"
    code, out, err = _cli(capsys, "snapshot", "restore", str(backup), "--into", str(new))
    assert code == 0, err
    assert f"restored index {header.index}" in out
    assert cluster_fingerprint(new / "ca" / "ca.pem") != header.cluster  # a new identity
    code, _, err = _cli(capsys, "snapshot", "restore", str(backup), "--into", str(new))
    assert code == 2
    assert "not empty" in err, err  # never over an existing cluster
    with NodeProcesses(load_cluster(new)) as procs:
        procs.start()
        with SyncClient(new, timeout=20) as client:
            for key, value in written.items():
                assert client.get(key) == value, key
            assert client.get("after") is None
            client.put("fresh", b"the restored cluster takes writes")
            assert client.get("fresh") == b"the restored cluster takes writes"


def test_a_damaged_backup_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.phx"
    bad.write_bytes(b"PHXBAK01" + b"\0" * 64)
    code, _, err = _cli(capsys, "snapshot", "restore", str(bad), "--into",
                        str(tmp_path / "x"))
    assert code == 2
    assert err.count("\n") == 1
    assert "cut short" in err
    assert not (tmp_path / "x").exists()
