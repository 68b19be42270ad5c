"""The clock-skew test hook (`phalanx.runtime.fault_hooks`): control-file parsing and the
watcher."""

from __future__ import annotations

import json
from pathlib import Path

import trio
import trio.testing

from phalanx.runtime.fault_hooks import control_file, read_clock_rate, watch_clock_rate


def test_control_file_needs_both_switches(tmp_path: Path) -> None:
    on = {"PHALANX_TEST_HOOKS": "1", "PHALANX_TEST_CONTROL_DIR": str(tmp_path)}
    assert control_file("n2", on) == tmp_path / "n2.ctl"
    assert control_file("n2", {"PHALANX_TEST_CONTROL_DIR": str(tmp_path)}) is None
    assert control_file("n2", {"PHALANX_TEST_HOOKS": "1"}) is None


def test_malformed_or_out_of_range_rates_are_refused(tmp_path: Path) -> None:
    ctl = tmp_path / "n1.ctl"
    assert read_clock_rate(ctl) == "no control file"
    for bad in ("{", "[]", '{"clock_rate": "fast"}', '{"clock_rate": true}',
                '{"clock_rate": 0}', '{"clock_rate": 1e9}'):
        ctl.write_text(bad)
        assert isinstance(read_clock_rate(ctl), str), bad
    ctl.write_text(json.dumps({"clock_rate": 2.5}))
    assert read_clock_rate(ctl) == 2.5


def test_the_watcher_applies_each_change_once(tmp_path: Path) -> None:
    ctl = tmp_path / "n1.ctl"
    applied: list[float] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_clock_rate, ctl, applied.append)
            await trio.sleep(1.0)
            ctl.write_text('{"clock_rate": 0.5}')
            await trio.sleep(1.0)
            ctl.write_text("garbage")
            await trio.sleep(1.0)
            ctl.write_text('{"clock_rate": 1.0}')
            await trio.sleep(1.0)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert applied == [0.5, 1.0]
