"""End to end on a leaderless cluster through the command line, with real node processes:
`cluster init --protocol leaderless` (client signing key and keyrings), `cluster up`, and
`phalanx kv` signing transactions: commuting updates, a write that requires the version the
nodes report, a linearizable and a stale read, and a transaction whose requirement does not
hold (one line "aborted: <reason>", exit 3)."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.cli.kv import EXIT_OK, EXIT_REJECTED, add_kv_command
from phalanx.ops.local_cluster import find_free_base_port

PHALANX = [sys.executable, "-m", "phalanx"]


@pytest.fixture
def leaderless_cluster(tmp_path: Path) -> Iterator[Path]:
    cluster = tmp_path / "lc"
    init = subprocess.run([*PHALANX, "cluster", "init", str(cluster), "--protocol",
                           "leaderless", "--nodes", "4", "--base-port",
                           str(find_free_base_port(4))],
                          capture_output=True, text=True, timeout=60, check=False)
    assert init.returncode == 0, init.stderr
    assert "client signing key" in init.stdout
    up = subprocess.Popen([*PHALANX, "cluster", "up", str(cluster), "--grace", "5"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield cluster
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=15)
        except subprocess.TimeoutExpired:
            up.kill()
        for pid_file in (cluster / "run").glob("*.pid"):  # never leave nodes behind
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)


def _kv(cluster: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """`phalanx kv` in this process (the same handler, no interpreter start-up)."""
    parser = argparse.ArgumentParser(prog="phalanx")
    add_kv_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["kv", "--cluster", str(cluster), "--timeout", "3", *argv])
    capsys.readouterr()
    code: int = args.handler(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_kv_on_a_leaderless_cluster(leaderless_cluster: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    deadline = time.monotonic() + 90  # nodes start slowly while the rest of the suite runs
    # warm up on another key: a timed-out add may still commit later
    while _kv(leaderless_cluster, capsys, "--timeout", "2", "add", "warm", "1")[0] != EXIT_OK:
        assert time.monotonic() < deadline, "the cluster never took a transaction"
        time.sleep(0.3)
    assert _kv(leaderless_cluster, capsys, "add", "visits", "1")[0] == EXIT_OK
    assert _kv(leaderless_cluster, capsys, "add", "visits", "2")[0] == EXIT_OK
    assert _kv(leaderless_cluster, capsys, "sadd", "tags", "red")[0] == EXIT_OK
    assert _kv(leaderless_cluster, capsys, "get", "visits")[:2] == (EXIT_OK, "3\n")
    assert _kv(leaderless_cluster, capsys, "smembers", "tags")[:2] == (EXIT_OK, "red\n")
    # put requires the version f+1 nodes report (read first)
    assert _kv(leaderless_cluster, capsys, "put", "visits", "10")[0] == EXIT_OK
    assert _kv(leaderless_cluster, capsys, "get", "visits")[:2] == (EXIT_OK, "10\n")
    # a requirement that does not hold (visits exists): aborted, one line, no effect
    code, _, err = _kv(leaderless_cluster, capsys, "--timeout", "1", "--require", "visits=",
                       "put", "visits", "99")
    assert code == EXIT_REJECTED
    assert err.startswith("aborted: ")
    assert err.count("\n") == 1
    assert _kv(leaderless_cluster, capsys, "get", "visits")[:2] == (EXIT_OK, "10\n")
    # a stale read asks one node: eventually it has applied the put too
    while _kv(leaderless_cluster, capsys, "get", "--stale", "visits")[1] != "10\n":
        assert time.monotonic() < deadline + 30
        time.sleep(0.1)
