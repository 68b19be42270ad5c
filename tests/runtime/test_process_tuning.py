"""`limit_malloc_arenas`: applied in a fresh process, and it leaves a user's setting alone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from phalanx.process_tuning import limit_malloc_arenas

_PROBE = "from phalanx.process_tuning import limit_malloc_arenas; print(limit_malloc_arenas())"


def _probe(env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                          text=True, check=True, timeout=60)
    return done.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's")
def test_applies_on_glibc_unless_the_environment_already_says() -> None:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):  # not glibc
        libc = None
    assert _probe(env) == ("True" if libc else "False")
    assert _probe({**env, "MALLOC_ARENA_MAX": "4"}) == "False"


def test_refuses_a_count_below_one() -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        limit_malloc_arenas(0)
