"""`phalanx sim`'s progress display: rich bars on a terminal, plain lines otherwise.

Owns: `SweepProgress` (a context manager; `group(label, total)` gives the `sweep` keyword
arguments that report one group of seeds). On a terminal with `rich` installed (it is a
dependency of the harness; importing `rich.progress` costs ~0.1 s of CPU, nothing beside a
sweep): one bar per group (cluster size and protocol) with its seed count, failures and
elapsed time, each failing seed printed above the bars as it happens. Elsewhere (a log, a
CI job, ``TERM=dumb``, no rich): `sweep`'s plain lines on the stream, no ``\\r``.

Rules: display only; never changes which seeds run or their results.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from phalanx.jepsen.sim.sweep import SeedOutcome


def wants_rich(stream: TextIO) -> bool:
    """A terminal that can show bars, and rich to draw them."""
    if not stream.isatty() or os.environ.get("TERM") == "dumb":
        return False
    try:
        import rich.progress  # noqa: F401
    except ImportError:
        return False
    return True


class SweepProgress:
    """See the module docstring. ``with SweepProgress(sys.stderr) as p: sweep(...,
    **p.group(label, total))``."""

    def __init__(self, stream: TextIO, *, rich: bool | None = None) -> None:
        self.stream = stream
        self.rich = wants_rich(stream) if rich is None else rich
        self._bar: Any = None

    def __enter__(self) -> SweepProgress:
        if self.rich:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            console = Console(file=self.stream, force_terminal=True)
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("{task.fields[failed]}"),
                                 TimeElapsedColumn(), console=console)
            self._bar.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.__exit__(kind, value, tb)
            self._bar = None

    def group(self, label: str, total: int) -> dict[str, Any]:
        """`sweep`'s ``progress`` / ``on_outcome`` arguments for one group of seeds."""
        bar = self._bar
        if bar is None:
            return {"progress": self.stream}
        task = bar.add_task(label, total=total, failed="0 failed")
        failed = 0

        def on_outcome(outcome: SeedOutcome) -> None:
            nonlocal failed
            if not outcome.ok:
                failed += 1
                bar.console.print(f"{label}: seed {outcome.seed} FAILED", highlight=False,
                                  markup=False)
            bar.update(task, advance=1, failed=f"{failed} failed")

        callback: Callable[[SeedOutcome], None] = on_outcome
        return {"progress": None, "on_outcome": callback}
