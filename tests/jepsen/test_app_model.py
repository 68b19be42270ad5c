"""A custom app's history checker (`phalanx.jepsen.app_model`): the machine as its own
sequential model, the history's text encoding of bytes, and the ``commands`` workload's
outcomes (`phalanx.jepsen.app_workload`) with a stand-in client."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from phalanx.client.errors import ClientTimeout, RequestRejected
from phalanx.jepsen.app_model import (
    APPLY,
    QUERY,
    MachineModel,
    check_app_history,
    from_text,
    to_text,
)
from phalanx.jepsen.app_workload import CommandsWorkload
from phalanx.jepsen.history import FAIL, INFO, OK, HistoryError, HistoryRecorder
from phalanx.jepsen.workloads import Invocation, WorkloadConfig

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tickets.py"


def _tickets() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tickets_example_for_model", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TICKETS = _tickets()


@given(st.binary())
def test_bytes_round_trip_through_history_text(data: bytes) -> None:
    assert from_text(to_text(data)) == data


def test_text_commands_stay_readable_and_bad_text_is_a_history_error() -> None:
    assert to_text(b"take:bakery") == "take:bakery"
    assert to_text(b"\xff").startswith("b64:")
    assert to_text(b"b64:x") != "b64:x"  # never ambiguous
    with pytest.raises(HistoryError):
        from_text("b64:!!")
    with pytest.raises(HistoryError):
        from_text(7)


def _history(ops: list[tuple[int, str, str, str, str | None]]) -> HistoryRecorder:
    """(process, "invoke"|type, f, command, result) events, in real-time order."""
    rec = HistoryRecorder()
    for t, (p, kind, f, command, result) in enumerate(ops):
        if kind == "invoke":
            rec.invoke(process=p, f=f, key="q", value=command, time=t)
        elif kind == OK:
            rec.complete(process=p, type=OK, time=t, value=(command, result))
        else:
            rec.complete(process=p, type=kind, time=t)  # type: ignore[arg-type]
    return rec


def _valid(ops: list[tuple[int, str, str, str, str | None]]) -> object:
    return check_app_history(_history(ops).history(), TICKETS.TicketMachine,
                             time_limit=None).linearizability.valid  # type: ignore[union-attr]


def test_concurrent_takes_linearize_in_either_order() -> None:
    assert _valid([(0, "invoke", APPLY, "take:q", None), (1, "invoke", APPLY, "take:q", None),
                   (1, OK, APPLY, "take:q", "1"), (0, OK, APPLY, "take:q", "2"),
                   (2, "invoke", QUERY, "peek:q", None), (2, OK, QUERY, "peek:q", "2")]) is True


def test_a_ticket_handed_out_twice_is_caught() -> None:
    # The control: a lost or doubled apply shows as two takes both answered 1.
    assert _valid([(0, "invoke", APPLY, "take:q", None), (1, "invoke", APPLY, "take:q", None),
                   (0, OK, APPLY, "take:q", "1"), (1, OK, APPLY, "take:q", "1")]) is False


def test_a_stale_read_is_caught_and_an_indeterminate_take_may_count() -> None:
    take = [(0, "invoke", APPLY, "take:q", None), (0, OK, APPLY, "take:q", "1")]
    assert _valid([*take, (1, "invoke", QUERY, "peek:q", None),
                   (1, OK, QUERY, "peek:q", "0")]) is False
    maybe = [(0, "invoke", APPLY, "take:q", None), (0, INFO, APPLY, "take:q", None)]
    for seen in ("0", "1"):
        assert _valid([*maybe, (1, "invoke", QUERY, "peek:q", None),
                       (1, OK, QUERY, "peek:q", seen)]) is True
    assert _valid([*maybe, (1, "invoke", QUERY, "peek:q", None),
                   (1, OK, QUERY, "peek:q", "2")]) is False


def test_the_model_is_a_machine_restored_from_its_snapshot_bytes() -> None:
    model = MachineModel(TICKETS.TicketMachine)
    result, after = model.run(model.initial(), b"take:q", False)
    assert (result, model.run(after, b"peek:q", True)[0]) == (b"1", b"1")
    rec = HistoryRecorder()
    rec.invoke(process=0, f="write", value="x", time=0)
    with pytest.raises(HistoryError, match="only apply and query"):
        check_app_history(rec.history(), TICKETS.TicketMachine)


class _Client:
    def __init__(self, answer: bytes | Exception) -> None:
        self.answer = answer
        self.calls: list[tuple[bytes, bool]] = []

    async def call(self, command: bytes, *, read_only: bool = False) -> bytes:
        self.calls.append((command, read_only))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_the_commands_workload_draws_from_the_app_and_maps_client_outcomes() -> None:
    w = CommandsWorkload(TICKETS.TicketMachine, WorkloadConfig(seed=3))
    again = CommandsWorkload(TICKETS.TicketMachine, WorkloadConfig(seed=3))
    invs = [w.next_invocation() for _ in range(50)]
    assert invs == [again.next_invocation() for _ in range(50)]  # seeded
    assert {i.f for i in invs} == {APPLY, QUERY}
    assert all(i.key in TICKETS.QUEUES for i in invs)
    take = Invocation(f=APPLY, key="q", value="take:q")

    async def outcomes() -> list[tuple[str, object]]:
        out = []
        for answer in (b"1", RequestRejected("no"), ClientTimeout("slow")):
            client = _Client(answer)
            done = await w.execute(client, take)
            assert client.calls == [(b"take:q", False)]
            out.append((done.type, done.value))
        return out

    assert trio.run(outcomes) == [(OK, ("take:q", "1")), (FAIL, None), (INFO, None)]


def test_a_machine_without_the_hook_has_no_workload() -> None:
    class Plain(TICKETS.TicketMachine):  # type: ignore[misc, name-defined]
        random_command = None

    with pytest.raises(ValueError, match="random_command"):
        CommandsWorkload(Plain)


def test_jepsen_run_takes_a_custom_app_and_names_its_workload_alike() -> None:
    from phalanx.appspec import get as get_app
    from phalanx.jepsen.app_model import WORKLOAD
    from phalanx.jepsen.harness.cli import APP_WORKLOAD, _app_choice

    assert APP_WORKLOAD == WORKLOAD
    reference = _app_choice(f"{EXAMPLE}:TicketMachine")
    assert get_app(reference).workload_names == (WORKLOAD,)
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match="no 'Nope'"):
        _app_choice(f"{EXAMPLE}:Nope")


def test_jepsen_check_takes_an_app_history(tmp_path: Path) -> None:
    import subprocess
    import sys

    from phalanx.jepsen.history import write_history

    def check(ops: list[tuple[int, str, str, str, str | None]]) -> int:
        path = tmp_path / "h.jsonl"
        write_history(path, _history(ops).ops)
        return subprocess.run([sys.executable, "-m", "phalanx", "jepsen", "check", "--app",
                               f"{EXAMPLE}:TicketMachine", str(path)], capture_output=True,
                              text=True, timeout=60, check=False).returncode

    take = [(0, "invoke", APPLY, "take:q", None), (0, OK, APPLY, "take:q", "1")]
    assert check(take) == 0
    assert check([*take, (1, "invoke", APPLY, "take:q", None),
                  (1, OK, APPLY, "take:q", "1")]) == 1  # a ticket handed out twice


def test_jepsen_run_says_when_an_app_has_nothing_to_send(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    from phalanx.cli.main import main

    plain = tmp_path / "plain.py"
    plain.write_text(EXAMPLE.read_text().replace("def random_command", "def _unused"))
    assert main(["jepsen", "run", "--app", f"{plain}:TicketMachine", "--time", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "no random_command(rng)" in err
