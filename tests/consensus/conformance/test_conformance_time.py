"""Property 4 of the conformance suite: time reaches a core only through `Tick`, randomness
only through the generator it was built with.

- Dynamically, for every subject: a node's recorded input sequence replayed into a fresh
  core while the process' clocks (`time.time`, `monotonic`, `perf_counter`, ... and their
  `_ns` forms) and global randomness (`random.random`, `randrange`, ..., `os.urandom`)
  return one set of values, and again with wildly different ones, gives the recorded
  output bytes both times; and none of them was called at all.
- Statically, over every module of `phalanx.consensus`: no import of a clock, I/O or
  concurrency module, no global `random` function (only the `random.Random` type, for
  an injected generator), no `id()` or `hash()` (per-process values).
"""

from __future__ import annotations

import ast
import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from core_replay import recorded, replay
from subjects import IDS, SUBJECTS, Subject

from phalanx import consensus

_CLOCKS = ("time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns",
           "process_time", "process_time_ns", "thread_time", "thread_time_ns")
_RANDOM = ("random", "randint", "randrange", "choice", "choices", "getrandbits", "uniform",
           "shuffle", "sample", "randbytes", "gauss", "expovariate")


def _patch(monkeypatch: pytest.MonkeyPatch, calls: list[str], base: float) -> None:
    def fake(name: str, value: Callable[..., object]) -> Callable[..., object]:
        def call(*args: object, **kwargs: object) -> object:
            calls.append(name)
            return value(*args, **kwargs)
        return call

    for name in _CLOCKS:
        ns = name.endswith("_ns")
        monkeypatch.setattr(time, name, fake(f"time.{name}",
                                             (lambda: int(base * 1e9)) if ns else (lambda: base)))
    rng = random.Random(int(base))
    for name in _RANDOM:
        monkeypatch.setattr(random, name, fake(f"random.{name}", getattr(rng, name)))
    monkeypatch.setattr(os, "urandom", fake("os.urandom", lambda n: bytes([int(base) % 256]) * n))


@pytest.mark.parametrize("subject", SUBJECTS, ids=IDS)
def test_outputs_ignore_clocks_and_global_randomness(subject: Subject) -> None:
    for rec in recorded(subject.name, 7)[:2]:
        for base in (0.0, 4.0e9):
            calls: list[str] = []
            with pytest.MonkeyPatch.context() as monkeypatch:
                _patch(monkeypatch, calls, base)
                outputs = replay(rec)
            assert calls == [], f"{rec.node} called {sorted(set(calls))}"
            assert outputs == rec.outputs, rec.node


_FORBIDDEN_MODULES = frozenset({
    "time", "datetime", "asyncio", "trio", "socket", "select", "selectors", "threading",
    "multiprocessing", "subprocess", "signal", "os", "secrets", "uuid", "io", "pathlib"})


def _modules() -> Iterator[Path]:
    root = Path(consensus.__file__).parent
    yield from sorted(root.rglob("*.py"))


def _problems(path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        where = f"{path.name}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in _FORBIDDEN_MODULES:
                    yield f"{where} imports {alias.name}"
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            top = node.module.split(".")[0]
            if top in _FORBIDDEN_MODULES:
                yield f"{where} imports from {node.module}"
            if top == "random" and any(a.name != "Random" for a in node.names):
                yield f"{where} imports a global random function"
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id == "random" and node.attr != "Random"):
            yield f"{where} uses random.{node.attr} (global randomness)"
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("id", "hash")):
            yield f"{where} calls {node.func.id}() (a per-process value)"


def test_consensus_modules_import_no_clock_or_global_randomness() -> None:
    paths = list(_modules())
    assert len(paths) > 20
    problems = [p for path in paths for p in _problems(path)]
    assert problems == []
