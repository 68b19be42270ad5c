"""Tests of the data-driven script parser/runner (`tests/datadriven.py`)."""

from __future__ import annotations

from pathlib import Path

import datadriven
import pytest

SCRIPT = """# comment
echo a=1 b=(x, y) flag
input line
----
out 1

multi
----
----
first

after blank
----
----
"""


def echo(d: datadriven.TestData) -> str:
    if d.cmd == "echo":
        return f"{d.arg('a')} {d.args['b']} {d.has('flag')} {d.input}\n"
    return "first\n\nafter blank\n"


def test_parse(tmp_path: Path) -> None:
    p = tmp_path / "t.txt"
    p.write_text(SCRIPT)
    cases = datadriven.parse(p)
    assert [c.cmd for c in cases] == ["echo", "multi"]
    assert cases[0].args == {"a": ("1",), "b": ("x", "y"), "flag": ()}
    assert cases[0].input == "input line"
    assert cases[0].expected == "out 1\n"
    assert cases[1].expected == "first\n\nafter blank\n"


def test_mismatch_fails_and_rewrite_fixes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "t.txt"
    p.write_text(SCRIPT)
    with pytest.raises(AssertionError, match="differs"):
        datadriven.run_file(p, echo)
    monkeypatch.setenv("PHALANX_REWRITE", "1")
    datadriven.run_file(p, echo)
    monkeypatch.delenv("PHALANX_REWRITE")
    datadriven.run_file(p, echo)  # now passes
    text = p.read_text()
    assert text.startswith("# comment\necho a=1 b=(x, y) flag\ninput line\n----\n1 ('x', 'y')")
    assert "----\n----\nfirst\n\nafter blank\n----\n----\n" in text


@pytest.mark.parametrize("bad", ["echo\nno separator\n", "a=1\n----\n", "cmd (\n----\n"])
def test_malformed_scripts(tmp_path: Path, bad: str) -> None:
    p = tmp_path / "t.txt"
    p.write_text(bad)
    with pytest.raises(ValueError):  # noqa: PT011
        datadriven.parse(p)
