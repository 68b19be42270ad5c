"""The data directory's exclusive lock (`phalanx.storage.lock`): a second node process on a
live node's directory stops at once with one line naming the holder's pid, before it reads
anything in the directory."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio
from runtime_helpers import make_cluster
from test_process import spawn, status_of, write_configs

from phalanx.ops.node_config import NodeConfig
from phalanx.runtime.node import NodeError, open_node
from phalanx.storage.lock import DirectoryLocked, lock_data_dir
from phalanx.storage.wal import segment_name

HOLD = ("import sys, time; from phalanx.storage.lock import lock_data_dir; "
        "lock = lock_data_dir(sys.argv[1]); print('locked', flush=True); time.sleep(60)")


def test_second_lock_names_the_holder_and_a_release_frees_it(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)],
                              stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"locked\n"
        with pytest.raises(DirectoryLocked, match=f"pid {holder.pid}"):
            lock_data_dir(str(tmp_path))
    finally:
        holder.kill()
        holder.wait()
    with lock_data_dir(str(tmp_path)) as lock:  # the kernel dropped the dead holder's lock
        assert lock.held
    assert not lock.held


def test_open_node_refuses_a_locked_directory_before_reading_the_wal(tmp_path: Path) -> None:
    config = make_cluster(tmp_path, 1)[0]
    config.data_dir.mkdir(parents=True, exist_ok=True)
    bad = config.data_dir / segment_name(1)
    bad.write_bytes(b"\xff" * 64)  # opening the WAL would raise CorruptionError
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(config.data_dir)],
                              stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"locked\n"
        with pytest.raises(NodeError, match=f"in use by another process \\(pid {holder.pid}\\)"):
            trio.run(_open, config)
    finally:
        holder.kill()
        holder.wait()
    assert bad.read_bytes() == b"\xff" * 64


async def _open(config: NodeConfig) -> None:
    async with open_node(config):
        pass


async def test_second_node_process_on_a_live_directory_fails_at_once(tmp_path: Path) -> None:
    configs = make_cluster(tmp_path, 1)
    paths = write_configs(tmp_path, configs)
    first = spawn(paths["n1"], tmp_path / "n1.log")
    try:
        with trio.fail_after(30):
            while True:
                if await status_of(configs[0]) is not None:
                    break
                await trio.sleep(0.05)
        began = time.monotonic()
        with trio.fail_after(30):
            second = await trio.run_process(
                [sys.executable, "-m", "phalanx.cli.node", str(paths["n1"])],
                capture_stdout=True, capture_stderr=True, check=False)
        assert second.returncode != 0
        lines = second.stderr.decode().strip().splitlines()
        assert len(lines) == 1, lines
        assert f"in use by another process (pid {first.pid})" in lines[0]
        assert "Traceback" not in second.stderr.decode()
        assert time.monotonic() - began < 15
        assert first.poll() is None  # the live node is untouched
        assert await status_of(configs[0]) is not None
    finally:
        first.terminate()
        first.wait(timeout=30)
