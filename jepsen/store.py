"""The run store: one directory per Jepsen run, laid out for people and tools.

Owns the layout and `create_run`::

    DIR/<test>/<YYYYMMDDTHHMMSSZ>/      (a "-<n>" suffix if that second is already taken)
        test.json       configuration, seed, nemesis schedule, phalanx/python/trio versions
        history.jsonl   the history (`phalanx.jepsen.history` format)
        results.json    the verdict (`phalanx.jepsen.checker.RunResult.to_json`)
        nodes/<id>/     each node's log and data, copied in by the harness
        latency.svg  rate.svg  index.html    written by `phalanx.jepsen.report`
    DIR/latest -> <test>/<timestamp>          a relative symlink, replaced atomically

Rules: the store only writes inside its run directory (and the ``latest`` link); JSON is
written with sorted keys; never pickles. Must not import the simulator, consensus cores or
the client. The timestamp is the caller's (``now``), so tests are deterministic.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Final, Protocol

from phalanx.jepsen.checker import RunResult
from phalanx.jepsen.history import History, write_history

TEST_JSON: Final = "test.json"
HISTORY: Final = "history.jsonl"
RESULTS: Final = "results.json"
NODES: Final = "nodes"
LATEST: Final = "latest"


class JsonEvent(Protocol):
    """A schedule event (`phalanx.jepsen.nemesis.FaultEvent` or a harness twin)."""

    def to_json(self) -> dict[str, object]: ...


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True, slots=True)
class RunStore:
    """One run's directory (see module docstring)."""

    path: Path

    def write_history(self, history: History) -> Path:
        out = self.path / HISTORY
        write_history(out, history)
        return out

    def write_results(self, result: RunResult | Mapping[str, object]) -> Path:
        doc = result.to_json() if isinstance(result, RunResult) else dict(result)
        out = self.path / RESULTS
        out.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return out

    def node_dir(self, node: str) -> Path:
        """``nodes/<node>/``, created; where the harness puts the node's log and data."""
        if not _NAME.match(node):
            raise ValueError(f"not a usable node name for a directory: {node!r}")
        path = self.path / NODES / node
        path.mkdir(parents=True, exist_ok=True)
        return path

    def copy_node(self, node: str, *, log: Path | None = None, data: Path | None = None) -> Path:
        """Copy a node's log file and data directory (if they exist) into `node_dir(node)`."""
        dest = self.node_dir(node)
        if log is not None and log.is_file():
            shutil.copy2(log, dest / log.name)
        if data is not None and data.is_dir():
            shutil.copytree(data, dest / "data", dirs_exist_ok=True)
        return dest


def create_run(
    base: str | Path,
    test: str,
    *,
    config: Mapping[str, object],
    seed: int | None = None,
    schedule: Sequence[JsonEvent] = (),
    now: dt.datetime | None = None,
) -> RunStore:
    """Create ``base/<test>/<timestamp>/`` with its ``test.json``, and point ``latest`` at it.

    Args:
        config: the run's configuration (JSON-able: workload, nemeses, nodes, rates...).
        now: the run's start (UTC); default the current time.

    Raises:
        ValueError: `test` is not a plain name (letters, digits, ``._+-``).
        OSError: the directory cannot be created.
    """
    if not _NAME.match(test):
        raise ValueError(f"test name must be letters, digits and ._+- only, got {test!r}")
    when = (now or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)
    stamp = when.strftime("%Y%m%dT%H%M%SZ")
    root = Path(base)
    parent = root / test
    parent.mkdir(parents=True, exist_ok=True)
    path = parent / stamp
    n = 0
    while True:
        try:
            path.mkdir()
            break
        except FileExistsError:
            n += 1
            path = parent / f"{stamp}-{n}"
    doc = {
        "test": test,
        "started": when.isoformat(),
        "seed": seed,
        "config": dict(config),
        "nemesis_schedule": [e.to_json() for e in schedule],
        "versions": {
            "phalanx": _version("phalanx"),
            "python": platform.python_version(),
            "trio": _version("trio"),
        },
    }
    (path / TEST_JSON).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", "utf-8")
    _point_latest(root, path.relative_to(root))
    return RunStore(path)


def _point_latest(root: Path, target: Path) -> None:
    """Replace ``root/latest`` by a symlink to `target` (relative), atomically."""
    tmp = root / f".{LATEST}.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target, target_is_directory=True)
    os.replace(tmp, root / LATEST)
