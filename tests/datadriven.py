"""A small port of cockroachdb/datadriven: scripted tests with expected output in the file.

Format (one test case per block; lines starting with ``#`` between cases are comments):

    cmd arg=v arg=(a,b) flag
    optional input lines
    ----
    expected output (ends at the first blank line)

When the expected output itself contains blank lines, it is fenced by a doubled separator:

    cmd
    ----
    ----
    output line

    more output
    ----
    ----

Running with ``PHALANX_REWRITE=1`` (e.g. ``PHALANX_REWRITE=1 .venv/bin/pytest
tests/consensus/raft``) rewrites every expected output with the actual one; review the diff
(`git diff tests/`) before committing: the expected output is the specification.

Rules: standard library only; a malformed script raises `ValueError` naming file and line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

SEPARATOR = "----"
_TOKEN = re.compile(r"([^\s=()]+)(?:=(\([^)]*\)|[^\s()]+))?")


@dataclass(slots=True)
class TestData:
    """One test case: a command, its arguments, optional input and the expected output."""

    pos: str
    cmd: str
    args: dict[str, tuple[str, ...]] = field(default_factory=dict)
    input: str = ""
    expected: str = ""

    __test__ = False  # not a pytest class

    def arg(self, name: str, default: str | None = None) -> str:
        """The single value of `name` (``name=v``), or `default`; raises if absent."""
        if name not in self.args:
            if default is None:
                raise ValueError(f"{self.pos}: {self.cmd} needs {name}=...")
            return default
        vals = self.args[name]
        if len(vals) != 1:
            raise ValueError(f"{self.pos}: {name} takes one value, got {vals}")
        return vals[0]

    def has(self, name: str) -> bool:
        return name in self.args


def parse_args(line: str, pos: str) -> tuple[str, dict[str, tuple[str, ...]]]:
    """Split ``cmd a=1 b=(x,y) c`` into the command and its arguments."""
    rest = line.strip()
    tokens: list[tuple[str, str | None]] = []
    i = 0
    while i < len(rest):
        if rest[i].isspace():
            i += 1
            continue
        m = _TOKEN.match(rest, i)
        if m is None or m.end() == i:
            raise ValueError(f"{pos}: cannot parse arguments at {rest[i:]!r}")
        tokens.append((m.group(1), m.group(2)))
        i = m.end()
    if not tokens or tokens[0][1] is not None:
        raise ValueError(f"{pos}: a line must start with a command: {line!r}")
    args: dict[str, tuple[str, ...]] = {}
    for key, val in tokens[1:]:
        if val is None:
            args[key] = ()
        elif val.startswith("("):
            inner = val[1:-1].strip()
            args[key] = tuple(v.strip() for v in inner.split(",")) if inner else ()
        else:
            args[key] = (val,)
    return tokens[0][0], args


def parse(path: Path) -> list[TestData]:
    """Parse every test case of a script file."""
    lines = path.read_text().split("\n")
    cases: list[TestData] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.startswith("#"):
            i += 1
            continue
        pos = f"{path}:{i + 1}"
        cmd, args = parse_args(line, pos)
        i += 1
        inp: list[str] = []
        while i < len(lines) and lines[i] != SEPARATOR:
            if not lines[i].strip():
                raise ValueError(f"{pos}: missing {SEPARATOR} after the command")
            inp.append(lines[i])
            i += 1
        if i >= len(lines):
            raise ValueError(f"{pos}: missing {SEPARATOR} after the command")
        i += 1
        out: list[str] = []
        if i < len(lines) and lines[i] == SEPARATOR:  # fenced output
            i += 1
            while i + 1 < len(lines) and not (lines[i] == SEPARATOR
                                               and lines[i + 1] == SEPARATOR):
                out.append(lines[i])
                i += 1
            if i + 1 >= len(lines):
                raise ValueError(f"{pos}: unterminated {SEPARATOR} {SEPARATOR} block")
            i += 2
        else:
            while i < len(lines) and lines[i].strip():
                out.append(lines[i])
                i += 1
        expected = "\n".join(out) + ("\n" if out else "")
        cases.append(TestData(pos=pos, cmd=cmd, args=args, input="\n".join(inp),
                              expected=expected))
    return cases


def _format_case(header: str, inp: str, output: str) -> str:
    text = header + "\n" + (inp + "\n" if inp else "") + SEPARATOR + "\n"
    body = output if output.endswith("\n") or not output else output + "\n"
    if "\n\n" in body.rstrip("\n") or body.startswith("\n"):
        return text + SEPARATOR + "\n" + body + SEPARATOR + "\n" + SEPARATOR + "\n"
    return text + body


def rewrite_requested() -> bool:
    return os.environ.get("PHALANX_REWRITE", "") not in ("", "0")


def run_file(path: Path, handler: Callable[[TestData], str]) -> None:
    """Run each case through `handler` and compare its output with the expected one.

    With ``PHALANX_REWRITE=1`` the file is rewritten with the actual outputs instead (the
    comments and command lines are kept as they are)."""
    rewrite = rewrite_requested()
    source = path.read_text().split("\n")
    cases = parse(path)
    chunks: list[str] = []
    cursor = 0
    for case in cases:
        actual = handler(case)
        if actual and not actual.endswith("\n"):
            actual += "\n"
        if not rewrite:
            if actual != case.expected:
                raise AssertionError(
                    f"{case.pos}: output of {case.cmd!r} differs\n--- expected\n"
                    f"{case.expected}--- actual\n{actual}")
            continue
        start = int(case.pos.rsplit(":", 1)[1]) - 1
        chunks.append("\n".join(source[cursor:start]) + ("\n" if start > cursor else ""))
        header = source[start]
        cursor = _skip_case(source, start)
        chunks.append(_format_case(header, case.input, actual))
    if rewrite:
        tail = "\n".join(source[cursor:])
        path.write_text("".join(chunks) + tail)


def _skip_case(lines: list[str], start: int) -> int:
    """The index of the first line after the case starting at `start`."""
    i = start + 1
    while lines[i] != SEPARATOR:
        i += 1
    i += 1
    if i < len(lines) and lines[i] == SEPARATOR:
        i += 1
        while not (lines[i] == SEPARATOR and lines[i + 1] == SEPARATOR):
            i += 1
        return i + 2
    while i < len(lines) and lines[i].strip():
        i += 1
    return i
