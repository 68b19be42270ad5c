"""Your own state machine on a real cluster (issue 22 item 1): `cluster init --app
FILE.py:FACTORY`, `cluster up`, `phalanx call`, and the same from Python through the public
client; a bad reference is one line at `cluster init`, before anything is created."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import trio

from phalanx.ops.local_cluster import find_free_base_port

PHALANX = [sys.executable, "-m", "phalanx"]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tickets.py"


def phalanx(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PHALANX, *argv], capture_output=True, text=True, timeout=60,
                          check=False, cwd=cwd)


def test_a_state_machine_in_a_file_runs_on_a_three_node_cluster(tmp_path: Path) -> None:
    app = tmp_path / "work" / "tickets.py"
    app.parent.mkdir()
    shutil.copy(EXAMPLE, app)
    cluster = tmp_path / "tickets"
    init = phalanx("cluster", "init", str(cluster), "--app", "tickets.py:TicketMachine",
                   "--base-port", str(find_free_base_port(3)), cwd=app.parent)
    assert init.returncode == 0, init.stderr
    # The node configs name the file by its absolute path: nodes start from any directory.
    assert f'app = "{app}:TicketMachine"' in (cluster / "nodes" / "n1.toml").read_text()
    up = subprocess.Popen([*PHALANX, "cluster", "up", str(cluster)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    try:
        c = str(cluster)
        deadline = time.monotonic() + 30
        while True:  # until a leader serves the first call
            first = phalanx("call", "--cluster", c, "--timeout", "5", "take:bakery")
            if first.returncode == 0 or time.monotonic() > deadline:
                break
        assert (first.returncode, first.stdout) == (0, "1\n"), first.stderr
        assert phalanx("call", "--cluster", c, "take:bakery").stdout == "2\n"
        peek = phalanx("call", "--cluster", c, "--read-only", "peek:bakery", "-o", "json")
        assert (peek.returncode, peek.stdout) == (0, '{"result": "2", "encoding": "utf-8"}\n')

        async def from_python() -> bytes:
            import phalanx as px

            async with px.open_client(px.open_cluster(cluster)) as client:
                return await client.call(b"take:bakery")

        assert trio.run(from_python) == b"3"
        stale = phalanx("call", "--cluster", c, "--stale", "peek:bakery")
        assert stale.returncode == 2
        assert "--stale needs --read-only" in stale.stderr
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=20)
        except subprocess.TimeoutExpired:
            up.kill()
        for pid_file in (cluster / "run").glob("*.pid"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_a_bad_app_reference_is_one_line_at_init(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("class NotAMachine:\n    pass\n")
    cases = {
        "nowhere.py:Machine": "no file",
        "no_such_module_xyz:Machine": "cannot import 'no_such_module_xyz'",
        "broken.py:Missing": "has no 'Missing'",
        "broken.py:NotAMachine": "has no apply, query, snapshot, restore",
    }
    for reference, expected in cases.items():
        done = phalanx("cluster", "init", str(tmp_path / "c"), "--app", reference,
                       cwd=tmp_path)
        assert done.returncode == 2, (reference, done.stderr)
        assert expected in done.stderr, (reference, done.stderr)
        assert done.stderr.count("\n") == 1, done.stderr
        assert not (tmp_path / "c").exists()
