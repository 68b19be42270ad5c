"""`tune_malloc`: applied in a fresh process, and it leaves a user's settings alone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from phalanx.process_tuning import tune_malloc

_PROBE = "from phalanx.process_tuning import tune_malloc; print(','.join(tune_malloc()))"


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
