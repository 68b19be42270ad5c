"""End to end through the `phalanx` command line, with real node processes:
`cluster init`, `cluster up`, `kv put/get/cas/scan/delete`, `kv add/sadd/srem/smembers/version`,
`status`, SIGKILL of the leader,
`kv get` again (nothing acknowledged lost), Ctrl-C of `cluster up`. And `phalanx demo`.

Every command runs as ``python -m phalanx ...`` (what the installed `phalanx` script runs).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from phalanx.cli.kv import add_kv_command
from phalanx.ops.local_cluster import find_free_base_port

PHALANX = [sys.executable, "-m", "phalanx"]


def phalanx(*argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PHALANX, *argv], capture_output=True, text=True, timeout=timeout,
                          check=False)


def _status(cluster: Path) -> list[dict[str, Any]]:
    done = phalanx("status", "--cluster", str(cluster), "--json", "--timeout", "1")
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


def _wait_for_leader(cluster: Path, *, among: set[str], above_term: int = 0,
                     timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for row in _status(cluster):
            if row["node"] in among and row["role"] == "leader" and row["term"] > above_term:
                return row
        time.sleep(0.2)
    raise AssertionError(f"no leader among {sorted(among)}: {_status(cluster)}")


@pytest.fixture
def running_cluster(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    cluster = tmp_path / "cluster"
    init = phalanx("cluster", "init", str(cluster), "--base-port", str(find_free_base_port(3)))
    assert init.returncode == 0, init.stderr
    assert "created raft cluster of 3 nodes" in init.stdout
    up = subprocess.Popen([*PHALANX, "cluster", "up", str(cluster), "--grace", "5"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield cluster, up
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
            try:
                up.wait(timeout=15)
            except subprocess.TimeoutExpired:
                up.kill()
        for pid_file in (cluster / "run").glob("*.pid"):  # never leave nodes behind
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)


def _kv_here(
    cluster: Path, capsys: pytest.CaptureFixture[bytes], *argv: str
) -> tuple[int, bytes, bytes]:
    """Run `phalanx kv` in this process (same handler, no interpreter start-up)."""
    parser = argparse.ArgumentParser(prog="phalanx")
    add_kv_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["kv", "--cluster", str(cluster), *argv])
    capsys.readouterr()
    code: int = args.handler(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cluster_init_up_kv_kill_leader_get(
    running_cluster: tuple[Path, subprocess.Popen[str]], capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    cluster, up = running_cluster
    c = str(cluster)
    _wait_for_leader(cluster, among={"n1", "n2", "n3"})

    assert phalanx("kv", "--cluster", c, "put", "greeting", "hello").returncode == 0
    got = phalanx("kv", "--cluster", c, "get", "greeting")
    assert (got.returncode, got.stdout) == (0, "hello\n")

    # The other commands, in-process against the same nodes.
    missing = _kv_here(cluster, capsysbinary, "get", "nope")
    assert missing == (1, b"", b"phalanx kv: not found: nope\n")
    assert _kv_here(cluster, capsysbinary, "cas", "greeting", "hello", "bonjour")[0] == 0
    code, _, err = _kv_here(cluster, capsysbinary, "cas", "greeting", "hello", "hi")
    assert (code, err) == (1, b"phalanx kv: cas failed: current value is bonjour\n")
    assert _kv_here(cluster, capsysbinary, "cas", "--if-absent", "gone", "x")[0] == 0
    assert _kv_here(cluster, capsysbinary, "delete", "gone")[0] == 0
    assert _kv_here(cluster, capsysbinary, "delete", "gone")[0] == 1
    assert _kv_here(cluster, capsysbinary, "scan", "g") == (0, b"greeting\tbonjour\n", b"")
    assert _kv_here(cluster, capsysbinary, "get", "--stale", "greeting")[0] == 0
    # The commuting updates (issue 15): add/mul on decimal integers, sadd/srem on sets.
    assert _kv_here(cluster, capsysbinary, "add", "visits", "5")[0] == 0
    assert _kv_here(cluster, capsysbinary, "add", "visits", "-2")[0] == 0
    assert _kv_here(cluster, capsysbinary, "get", "visits")[:2] == (0, b"3\n")
    assert _kv_here(cluster, capsysbinary, "add", "greeting", "1")[0] == 3  # not a number
    for member in ("red", "blue", "red"):
        assert _kv_here(cluster, capsysbinary, "sadd", "tags", member)[0] == 0
    assert _kv_here(cluster, capsysbinary, "srem", "tags", "blue")[0] == 0
    assert _kv_here(cluster, capsysbinary, "smembers", "tags")[:2] == (0, b"red\n")
    assert _kv_here(cluster, capsysbinary, "version", "greeting")[:2] == (
        0, hashlib.sha512(b"bonjour").hexdigest().encode() + b"\n")
    _scripting_features(cluster, capsysbinary)

    table = phalanx("status", "--cluster", c)
    assert table.returncode == 0, table.stdout + table.stderr
    assert table.stdout.splitlines()[0].split()[:2] == ["NODE", "ROLE"]
    rows = _status(cluster)
    assert sorted(r["role"] for r in rows) == ["follower", "follower", "leader"]
    leader = next(r for r in rows if r["role"] == "leader")
    assert all(r["commit_index"] >= 1 and r["term"] == leader["term"] for r in rows)

    # SIGKILL the leader's process; the value written through it must survive.
    victim = leader["node"]
    pid = int((cluster / "run" / f"{victim}.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    survivors = {"n1", "n2", "n3"} - {victim}
    new = _wait_for_leader(cluster, among=survivors, above_term=leader["term"])
    assert new["node"] != victim
    got = phalanx("kv", "--cluster", c, "get", "greeting")
    assert (got.returncode, got.stdout) == (0, "bonjour\n")
    assert _kv_here(cluster, capsysbinary, "put", "after", "kill")[0] == 0
    assert _kv_here(cluster, capsysbinary, "get", "after")[:2] == (0, b"kill\n")
    status = phalanx("status", "--cluster", c, "--json", "--timeout", "1")
    assert status.returncode == 1  # not every node answered
    rows_by_node = {r["node"]: r for r in json.loads(status.stdout)}
    assert rows_by_node[victim]["role"] == "unreachable"

    # Ctrl-C stops the remaining nodes; `up` reports the node that died and exits 1.
    up.send_signal(signal.SIGINT)
    out, err = up.communicate(timeout=20)
    assert up.returncode == 1
    assert "cluster up; Ctrl-C stops it" in out
    assert f"{victim} exited with status -9" in err
    assert not list((cluster / "run").glob("*.pid"))
    for node in survivors:
        log = (cluster / "logs" / f"{node}.log").read_text()
        assert "SIGINT" in log or "SIGTERM" in log, log[-2000:]


def _scripting_features(cluster: Path, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    """Issue 22 item 3 on the live cluster: options after the subcommand, values from stdin
    and files, raw and JSON output, unambiguous scan lines, txn and delete --prefix."""
    c = str(cluster)
    got = phalanx("kv", "get", "greeting", "--cluster", c, "-o", "json")  # options anywhere
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout) == {"key": "greeting", "value": "bonjour", "encoding": "utf-8"}
    blob = bytes(range(256))
    (cluster / "blob.bin").write_bytes(blob)
    assert _kv_here(cluster, capsysbinary, "put", "blob", f"@{cluster / 'blob.bin'}")[0] == 0
    assert _kv_here(cluster, capsysbinary, "get", "blob", "--raw")[:2] == (0, blob)
    code, out, _ = _kv_here(cluster, capsysbinary, "get", "blob", "-o", "json")
    assert code == 0
    doc = json.loads(out)
    assert doc["encoding"] == "base64"
    assert base64.b64decode(doc["value"]) == blob
    piped = subprocess.run([*PHALANX, "kv", "--cluster", c, "put", "multi", "-"],
                           input=b"a\tb\nc\\d", capture_output=True, timeout=30, check=False)
    assert piped.returncode == 0, piped.stderr
    assert _kv_here(cluster, capsysbinary, "put", "at", "@@home")[0] == 0
    assert _kv_here(cluster, capsysbinary, "get", "at")[:2] == (0, b"@home\n")
    assert _kv_here(cluster, capsysbinary, "scan", "mu") == (0, b"multi\ta\\tb\\nc\\\\d\n", b"")
    assert _kv_here(cluster, capsysbinary, "scan", "g", "--keys-only") == (0, b"greeting\n", b"")
    code, out, _ = _kv_here(cluster, capsysbinary, "scan", "", "-o", "json")
    assert {json.loads(line)["key"] for line in out.splitlines()} >= {"greeting", "multi", "blob"}
    # txn: the guard holds -> the then-branch, in order; else the else-branch.
    assert _kv_here(cluster, capsysbinary, "txn", "--if-absent", "lock", "--put", "lock", "me",
                    "--put", "owner", "me")[:2] == (0, b"succeeded\n")
    code, out, _ = _kv_here(cluster, capsysbinary, "txn", "--if", "lock=you", "--delete", "lock",
                            "--else-put", "seen", "x")
    assert (code, out) == (1, b"failed: the else branch ran\n")
    assert _kv_here(cluster, capsysbinary, "get", "seen")[:2] == (0, b"x\n")
    assert _kv_here(cluster, capsysbinary, "get", "lock")[:2] == (0, b"me\n")
    for i in range(5):
        assert _kv_here(cluster, capsysbinary, "put", f"tmp/{i}", str(i))[0] == 0
    assert _kv_here(cluster, capsysbinary, "delete", "--prefix", "tmp/")[:2] == (0, b"deleted 5\n")
    assert _kv_here(cluster, capsysbinary, "scan", "tmp/") == (0, b"", b"")
    assert _kv_here(cluster, capsysbinary, "delete", "--prefix", "tmp/")[:2] == (1, b"deleted 0\n")


def test_kv_against_a_cluster_that_is_down_says_connection_refused_at_once(
        tmp_path: Path) -> None:
    """Nothing listens on any node's port: exit 7 and a message that says so, without
    waiting for --timeout (issue 22; it used to wait 5 s and say "may or may not have taken
    effect", though nothing was ever sent)."""
    cluster = tmp_path / "cluster"
    assert phalanx("cluster", "init", str(cluster), "--nodes", "3",
                   "--base-port", str(find_free_base_port(3))).returncode == 0
    started = time.monotonic()
    done = phalanx("kv", "--cluster", str(cluster), "--timeout", "20", "put", "k", "v")
    assert done.returncode == 7, done.stderr
    assert time.monotonic() - started < 15  # not the 20 s timeout
    assert "connection refused by every node: n1 (127.0.0.1:" in done.stderr
    assert "had no effect" in done.stderr
    assert done.stderr.count("\n") == 1  # one line


def test_demo_passes(tmp_path: Path) -> None:
    """The real-cluster demo, shortened: exit 0 means linearizable, nothing acknowledged
    lost and the restarted node caught up."""
    keep = tmp_path / "demo"
    done = phalanx("demo", "--warmup", "1", "--seed", "1", "--keep", str(keep), timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "PASS" in done.stdout
    assert "SIGKILL" in done.stdout
    assert (keep / "history.jsonl").is_file()
    check = phalanx("jepsen", "check", str(keep / "history.jsonl"))
    assert check.returncode == 0, check.stdout
    assert not list((keep / "cluster" / "run").glob("*.pid"))


def test_demo_local_is_still_reachable() -> None:
    done = phalanx("demo", "--local", "--keys", "50", "--checkpoint-every", "10")
    assert done.returncode == 0, done.stdout + done.stderr
