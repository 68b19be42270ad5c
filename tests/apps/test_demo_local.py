"""The local crash/recovery demo runs end to end and verifies what it claims."""

from __future__ import annotations

import argparse

import pytest

from phalanx.demo import local as demo_local


def test_demo_crashes_recovers_and_verifies(capsys: pytest.CaptureFixture[str]) -> None:
    code = demo_local.run(["--keys", "40", "--crash-at", "33", "--checkpoint-every", "10"])
    out = capsys.readouterr().out
    assert code == 0
    assert "torn tail cut off" in out
    assert "loaded checkpoint at entry 30, replayed 2 WAL entries" in out
    assert "acknowledged writes found intact : 32 of 32" in out
    assert "answered from the session table" in out
    assert "verification          : PASSED" in out


def test_demo_crash_on_first_write(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo_local.run(["--keys", "3", "--crash-at", "1"]) == 0
    assert "loaded checkpoint at entry 0, replayed 0" in capsys.readouterr().out


def test_demo_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo_local.run(["--keys", "5", "--crash-at", "9"]) == 2
    assert "error" in capsys.readouterr().err


def test_add_demo_command_registers_a_handler(tmp_path: object) -> None:
    parser = argparse.ArgumentParser(prog="phalanx")
    demo_local.add_demo_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["demo", "--keys", "7"])
    assert args.keys == 7
    assert callable(args.handler)
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["demo", "--help"])
    assert exc.value.code == 0
