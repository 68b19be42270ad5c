"""`phalanx sim --protocol pbft --set NAME=VALUE`: the simulator's `PbftConfig` fields can be
fixed (the scale bench batches more at n = 180); an unknown name or a bad value is a one-line
usage error, not silently ignored (it used to be: PBFT took no knobs and dropped them)."""

from __future__ import annotations

import re

import pytest

from phalanx.cli.main import main
from phalanx.jepsen.sim.pbft import SIM_DEFAULTS
from phalanx.jepsen.sim.run import RunConfig, run

MS = 1_000_000


def _run(settings: tuple[tuple[str, int], ...]) -> tuple[str, int]:
    result = run(RunConfig(seed=3, protocol="pbft", nodes=4, faults=(), swarm=False,
                           clients=6, time_ns=250 * MS, liveness_ns=600 * MS,
                           settings=settings, keep_trace=True))
    assert result.ok, result.report()
    sizes = [int(m.group(1)) for line in result.trace_lines or []
             if (m := re.search(r" PrePrepare .*\|m\|=(\d+)", line))]
    return result.trace_hash, max(sizes, default=0)


def test_batch_size_changes_the_batches_and_the_default_is_the_old_config() -> None:
    default_hash, default_max = _run(())
    same_hash, _ = _run(tuple(SIM_DEFAULTS.items()))
    assert same_hash == default_hash  # the defaults spelled out are the old hard-coded config
    one_hash, one_max = _run((("batch_size", 1),))
    assert one_hash != default_hash
    assert one_max <= 1 < default_max


@pytest.mark.parametrize(("item", "says"), [
    ("bogus=1", "unknown pbft sim knob(s) ['bogus']"),
    ("batch_size=0", "must be positive integers"),
    ("log_window=4", "log_window must be >= checkpoint_interval"),
    ("targeted_attacks=2", "must be 0 or 1"),
])
def test_a_bad_knob_is_a_one_line_usage_error(item: str, says: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["sim", "--protocol", "pbft", "--seeds", "1", "--set", item])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert says in err
    assert len(err.splitlines()) == 1
