"""Phase tracing (`phalanx.runtime.phase_trace`): off unless `PHALANX_TRACE_PHASES` is set; when on,
the driver's events are written in the order the ordering rule imposes on them."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from runtime_helpers import wait_for
from test_driver_pipeline import GatedCommitter, ScriptedCore, Sink, call, make_driver

from phalanx.runtime.phase_trace import ENV_VAR, PhaseTrace, phase_trace_from_env


def test_tracing_is_off_without_the_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert phase_trace_from_env("n1") is None


def test_the_environment_variable_names_the_directory(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "traces"))
    trace = phase_trace_from_env("n7")
    assert trace is not None
    trace.mark("call", "c/1")
    trace.close()
    (line,) = (tmp_path / "traces" / "n7.trace").read_text().splitlines()
    stamp, event, detail = line.split(" ")
    assert int(stamp) > 0
    assert (event, detail) == ("call", "c/1")


async def test_a_traced_write_logs_its_phases_in_order(tmp_path: Path) -> None:
    core, committer, sent = ScriptedCore("leader"), GatedCommitter(), []
    trace = PhaseTrace(tmp_path / "n1.trace")
    driver = make_driver(core, committer, sent, idle_inline=True, trace=trace)
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await driver.call(call(1), Sink())
        await wait_for(lambda: core.persisted == [1])
        nursery.cancel_scope.cancel()
    trace.close()
    lines = [line.split(" ", 2) for line in (tmp_path / "n1.trace").read_text().splitlines()]
    stamps = [int(fields[0]) for fields in lines]
    assert stamps == sorted(stamps)
    events = [f"{fields[1]} {fields[2]}".strip() for fields in lines]
    # No `output_pending` given: the driver assumes the early message may still be unwritten
    # and lets writer tasks run before its inline write.
    assert events[:4] == ["call c/1", "send AppendEntries", "yield_for_output", "io_inline 1"]
    assert events[4].startswith("io_work ")
    assert events[4].endswith(" sync")
    assert events[5] == "send AppendEntriesResponse"

