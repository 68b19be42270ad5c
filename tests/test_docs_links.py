"""The documentation's references resolve (issue 22: docs "checked in CI for broken
references"): every relative link in README.md, CHANGELOG.md and docs/*.md names a file
that exists (and, for ``file.md#anchor``, a heading of that file, by GitHub's slug rule);
every repository path written in backticks (``bench/kv.py``, ``docs/GOSSIP.md``, ...)
exists; every ``phalanx.x.y`` module named in backticks imports."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_PATH = re.compile(r"`((?:docs|bench|tests|examples|jepsen|consensus|apps|storage|net|gossip|"
                   r"clustersend|phalanx)/[A-Za-z0-9_./-]+\.(?:py|md|png|svg|json|toml))`")
_MODULE = re.compile(r"`(phalanx(?:\.[a-z_][a-z0-9_]*)+)`")
GENERATED = {ROOT / "docs" / "CLI.md"}
"""Written by `make docs` (`python -m phalanx.cli.reference`), not kept in the repository."""


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _problems(doc: Path) -> list[str]:
    text = doc.read_text(encoding="utf-8")
    out: list[str] = []
    for m in _LINK.finditer(text):
        target = m.group(1)
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path) if path else doc
        if linked.resolve() in GENERATED:
            continue
        if not linked.exists():
            out.append(f"link {target}: no such file")
        elif anchor and linked.suffix == ".md":
            heads = {_slug(h) for h in re.findall(r"^#+\s+(.*)$", linked.read_text(), re.M)}
            if anchor not in heads:
                out.append(f"link {target}: no heading #{anchor} in {linked.name}")
    for m in _PATH.finditer(text):
        if not (ROOT / m.group(1)).exists():
            out.append(f"path `{m.group(1)}` does not exist")
    return out


@pytest.mark.parametrize("doc", FILES, ids=[str(f.relative_to(ROOT)) for f in FILES])
def test_links_and_paths_resolve(doc: Path) -> None:
    assert not _problems(doc)


def test_named_modules_import() -> None:
    names = sorted({m.group(1) for doc in FILES
                    for m in _MODULE.finditer(doc.read_text(encoding="utf-8"))})
    missing = []
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            # `phalanx.x.attr`: the last part may be an attribute of a module
            module, _, attr = name.rpartition(".")
            try:
                if not hasattr(importlib.import_module(module), attr):
                    missing.append(name)
            except ModuleNotFoundError:
                missing.append(name)
    assert not missing, f"docs name modules that do not exist: {missing}"


def test_the_checker_sees_a_broken_link(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text("# Title\n[a](missing.md) [b](x.md#title) [c](x.md#nope) `bench/nope.py`\n")
    assert _problems(doc) == ["link missing.md: no such file",
                              "link x.md#nope: no heading #nope in x.md",
                              "path `bench/nope.py` does not exist"]
