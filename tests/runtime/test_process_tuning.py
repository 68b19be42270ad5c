"""`tune_malloc`: applied in a fresh process, and it leaves a user's settings alone; `trim_malloc`
and `TrimPolicy`: holes in the heap go back to the OS, once after each checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from phalanx.runtime.process_tuning import TrimPolicy, system_malloc_exec, tune_malloc

_PROBE = "from phalanx.runtime.process_tuning import tune_malloc; print(','.join(tune_malloc()))"


def _probe(env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                          text=True, check=True, timeout=60)
    return done.stdout.strip()


def test_applies_on_glibc_only_and_unless_the_environment_already_says() -> None:
    """glibc: both settings unless the environment has them. Elsewhere (no `mallopt`, or one
    that refuses these parameters): nothing, and no error."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_")}
    try:
        glibc = bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (ValueError, OSError):  # not glibc
        glibc = False
    both = "MALLOC_ARENA_MAX,MALLOC_MMAP_THRESHOLD_"
    assert _probe(env) == (both if glibc else "")
    assert _probe({**env, "MALLOC_ARENA_MAX": "4"}) == (
        "MALLOC_MMAP_THRESHOLD_" if glibc else "")
    assert _probe({**env, "MALLOC_ARENA_MAX": "4", "MALLOC_MMAP_THRESHOLD_": "65536"}) == ""


def test_refuses_values_out_of_range() -> None:
    with pytest.raises(ValueError, match="arenas >= 1"):
        tune_malloc(arenas=0)
    with pytest.raises(ValueError, match="mmap_threshold >= 4096"):
        tune_malloc(mmap_threshold=10)


_TRIM_PROBE = """
from phalanx.runtime.process_tuning import trim_malloc, tune_malloc
tune_malloc()
def rss():
    return int(open('/proc/self/statm').read().split()[1]) * 4096
blocks = [b'x' * 16384 for _ in range(6000)]  # ~94 MiB of heap, below the mmap threshold
keep = blocks[-1]  # pins the heap's top: what is freed below it is a hole
del blocks
before = rss()
released = trim_malloc()
print(int(released), (before - rss()) >> 20)
"""


def test_trim_gives_holes_in_the_heap_back_on_glibc() -> None:
    done = subprocess.run([sys.executable, "-c", _TRIM_PROBE], capture_output=True,
                          text=True, check=True, timeout=60,
                          env={k: v for k, v in os.environ.items()
                               if not k.startswith("MALLOC_")})
    released, freed_mib = map(int, done.stdout.split())
    try:
        glibc = bool(os.confstr("CS_GNU_LIBC_VERSION")) and sys.platform.startswith("linux")
    except (ValueError, OSError):
        glibc = False
    if glibc:
        assert released == 1
        assert freed_mib > 50
    else:
        assert (released, freed_mib) == (0, 0)


def test_trim_policy_trims_twice_per_checkpoint_after_it_settles() -> None:
    policy = TrimPolicy(now=0.0, settle=3.0, again=15.0)
    assert not policy.due(now=1.0, checkpoints_written=0, in_flight=False)
    assert policy.due(now=3.5, checkpoints_written=0, in_flight=False)  # after start-up
    assert not policy.due(now=30.0, checkpoints_written=0, in_flight=False)  # nothing new
    assert not policy.due(now=31.0, checkpoints_written=1, in_flight=False)  # just written
    assert not policy.due(now=33.0, checkpoints_written=1, in_flight=False)
    assert not policy.due(now=34.5, checkpoints_written=1, in_flight=True)  # another running
    assert not policy.due(now=35.0, checkpoints_written=2, in_flight=False)  # restarts the wait
    assert policy.due(now=38.0, checkpoints_written=2, in_flight=False)
    assert not policy.due(now=45.0, checkpoints_written=2, in_flight=False)
    assert policy.due(now=50.0, checkpoints_written=2, in_flight=False)  # the second trim
    assert not policy.due(now=90.0, checkpoints_written=2, in_flight=False)
    late = TrimPolicy(now=0.0)
    assert late.due(now=100.0, checkpoints_written=0, in_flight=False)
    assert not late.due(now=101.0, checkpoints_written=0, in_flight=False)
    assert not late.due(now=200.0, checkpoints_written=3, in_flight=False)
    assert late.due(now=400.0, checkpoints_written=3, in_flight=False)  # both times passed: once
    assert not late.due(now=401.0, checkpoints_written=3, in_flight=False)
    with pytest.raises(ValueError, match="settle"):
        TrimPolicy(now=0.0, settle=-1)
    with pytest.raises(ValueError, match="again"):
        TrimPolicy(now=0.0, settle=5.0, again=1.0)


def test_a_node_re_executes_on_the_system_allocator_unless_told_otherwise() -> None:
    """`phalanx node run` re-executes itself once with PYTHONMALLOC=malloc on glibc, with the
    same interpreter and arguments; a PYTHONMALLOC already set (the user's, or the re-executed
    process's own) and other C libraries leave the process alone."""
    argv = ["/venv/bin/python", "/venv/bin/phalanx", "node", "run", "n1.toml"]
    plan = system_malloc_exec({"HOME": "/h"}, argv, "/venv/bin/python", glibc=True)
    assert plan == ("/venv/bin/python", argv, {"HOME": "/h", "PYTHONMALLOC": "malloc"})
    path, again_argv, again_env = plan
    assert system_malloc_exec(again_env, again_argv, path, glibc=True) is None  # no loop
    assert system_malloc_exec({"PYTHONMALLOC": "pymalloc"}, argv, argv[0], glibc=True) is None
    assert system_malloc_exec({}, argv, argv[0], glibc=False) is None
    assert system_malloc_exec({}, argv[:1], argv[0], glibc=True) is None
    module = ["/usr/bin/python3", "-m", "phalanx", "node", "run", "n1.toml"]
    assert system_malloc_exec({}, module, "/usr/bin/python3", glibc=True) == (
        "/usr/bin/python3", module, {"PYTHONMALLOC": "malloc"})


def test_the_re_executed_process_runs_on_the_system_allocator() -> None:
    """End to end in a child process: the entry point's call re-executes it (same pid), and
    the new image sees PYTHONMALLOC=malloc."""
    code = ("import os, sys; from phalanx.runtime.process_tuning import use_system_malloc; "
            "print(os.getpid(), os.environ.get('PYTHONMALLOC'), flush=True); "
            "use_system_malloc()")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONMALLOC"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, check=True, timeout=60)
    lines = done.stdout.split()
    try:
        glibc = bool(os.confstr("CS_GNU_LIBC_VERSION")) and sys.platform.startswith("linux")
    except (ValueError, OSError):
        glibc = False
    if glibc:  # two runs of the same pid: before and after the exec
        assert lines == [lines[0], "None", lines[0], "malloc"]
    else:
        assert lines[1:] == ["None"]


def test_only_the_node_run_command_re_executes() -> None:
    """`phalanx.cli.main.main` switches allocators for `phalanx node run CONFIG` alone (before it
    imports the node runtime), never for help, other commands, or an in-process call."""
    from phalanx.cli.main import _runs_a_node

    assert _runs_a_node(["node", "run", "n1.toml"])
    assert _runs_a_node(["node", "run", "n1.toml", "--byzantine", "silent"])
    assert not _runs_a_node(["node", "run", "--help"])
    assert not _runs_a_node(["node", "-h"])
    assert not _runs_a_node(["kv", "--cluster", "c", "get", "node"])
    assert not _runs_a_node(["cluster", "up", "c"])
