"""Every argument of every `phalanx` subcommand has a help text (issue 22: "--help on every
argument"): walks the whole parser tree."""

from __future__ import annotations

import argparse

from phalanx.cli.main import build_parser


def _undocumented(parser: argparse.ArgumentParser, path: str) -> list[str]:
    out: list[str] = []
    for action in parser._actions:  # argparse has no public walk
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _undocumented(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction) and not action.help:
            out.append(f"{path}: {'/'.join(action.option_strings) or action.dest}")
    return out


def test_every_argument_has_help() -> None:
    parser = build_parser()
    assert _undocumented(parser, "phalanx") == []
    # the walk reaches the leaves (a control: it would miss nothing by finding nothing)
    assert len([a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]) == 1
