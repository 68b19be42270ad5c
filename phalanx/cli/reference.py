"""The command-line reference as Markdown: every `phalanx` command's ``--help``, generated.

Owns: `reference()` and ``python -m phalanx.cli.reference [FILE]`` (what `make docs` runs to
write docs/CLI.md, a generated file: not kept in the repository). Help is rendered at a
fixed width of 100 columns, so the page does not depend on the terminal.
"""

from __future__ import annotations

import argparse
import os
import sys

from phalanx.cli.main import build_parser


def _commands(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, str]]:
    out = [(path, parser.format_help())]
    for action in parser._actions:  # argparse has no public walk
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _commands(sub, f"{path} {name}")
    return out


def reference() -> str:
    """Markdown: a heading and the help text of every command, in tree order."""
    os.environ["COLUMNS"] = "100"  # argparse's formatter reads it
    parts = ["# Command-line reference\n",
             "Generated from the parsers (`python -m phalanx.cli.reference`); every command "
             "also answers `--help`.\n"]
    for path, text in _commands(build_parser(), "phalanx"):
        parts.append(f"## {path}\n\n```text\n{text.rstrip()}\n```\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    text = reference()
    if args:
        with open(args[0], "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
