"""Safe `phalanx cluster up` (issue 21, item 1), on real node processes of one 1-node cluster:
a second `cluster up` refuses to start a node that runs, leaves its pid file alone, and
`cluster up --node N` restarts a killed node while the supervisor that lost it is still
around; that supervisor then leaves the new node's pid file in place; the restarted node
answers /health and /ready (item 5). Plus `live_pid`'s stale and reused pid files."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from phalanx.ops.cluster_command import add_cluster_command
from phalanx.ops.local_cluster import find_free_base_port, init_cluster
from phalanx.ops.processes import live_pid

PHALANX = [sys.executable, "-m", "phalanx"]


def _wait(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _up_here(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """`phalanx cluster up` in this process (for the calls that refuse: no node starts)."""
    parser = argparse.ArgumentParser(prog="phalanx")
    add_cluster_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["cluster", "up", *argv])
    capsys.readouterr()
    code: int = args.handler(args)
    return code, capsys.readouterr().err


def test_second_up_refuses_and_up_node_restarts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = tmp_path / "c"
    base = find_free_base_port(1)
    init_cluster(cluster, nodes=1, base_port=base)
    pid_file = cluster / "run" / "n1.pid"
    first = subprocess.Popen([*PHALANX, "cluster", "up", str(cluster), "--grace", "5"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    second: subprocess.Popen[str] | None = None
    try:
        _wait(lambda: _pid(pid_file) is not None, "the first node's pid file")
        log = cluster / "logs" / "n1.log"
        _wait(lambda: "serving peers" in log.read_text(), "the first node")
        node = _pid(pid_file)
        assert node is not None
        assert live_pid(pid_file) == node

        # A second `cluster up` (all nodes, or --node n1) refuses, one line, exit 2.
        for extra in ((), ("--node", "n1")):
            code, err = _up_here(capsys, str(cluster), *extra)
            assert code == 2, err
            assert err.count("\n") == 1, err
            assert f"already running: n1 (pid {node})" in err
        assert _pid(pid_file) == node
        assert _alive(node)

        # The node dies while its supervisor is stopped (so it cannot reap it yet); a second
        # supervisor restarts it; the first then wakes up, sees its node gone and must not
        # delete the new node's pid file.
        os.kill(first.pid, signal.SIGSTOP)
        os.kill(node, signal.SIGKILL)
        _wait(lambda: live_pid(pid_file) is None, "the killed node to be seen as dead")
        second = subprocess.Popen([*PHALANX, "cluster", "up", str(cluster), "--node", "n1",
                                   "--grace", "5"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait(lambda: _pid(pid_file) not in (None, node), "the restarted node's pid file")
        restarted = _pid(pid_file)
        assert restarted is not None
        _wait(lambda: log.read_text().count("serving peers") == 2, "the restarted node")
        # item 5: the restarted node is live at once, and ready once it leads (1 node)
        http = f"http://127.0.0.1:{base + 200}"
        assert _get(f"{http}/health") == (200, "ok\n")
        _wait(lambda: _get(f"{http}/ready") == (200, "ready\n"), "the node to be ready")
        os.kill(first.pid, signal.SIGCONT)
        _, err = first.communicate(timeout=30)
        assert first.returncode == 1  # its only node died
        assert "n1 exited with status -9" in err
        assert _pid(pid_file) == restarted
        assert live_pid(pid_file) == restarted

        second.send_signal(signal.SIGINT)
        out, err = second.communicate(timeout=30)
        assert second.returncode == 0, out + err
        assert not pid_file.exists()  # its own pid file: removed on a clean stop
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.wait()
        if (pid := _pid(pid_file)) is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_live_pid_ignores_stale_and_reused_pid_files(tmp_path: Path) -> None:
    path = tmp_path / "n1.pid"
    assert live_pid(path) is None  # no file
    path.write_text("not a pid\n")
    assert live_pid(path) is None
    path.write_text(f"{os.getpid()}\n")
    assert live_pid(path) == os.getpid()  # this live process, started before the file
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path.write_text(f"{dead.pid}\n")
    assert live_pid(path) is None  # its process is gone
    if Path("/proc/self/stat").exists():
        # A file written long before this process started names a reused pid.
        path.write_text(f"{os.getpid()}\n")
        long_ago = time.time() - 10**7
        os.utime(path, (long_ago, long_ago))
        assert live_pid(path) is None
