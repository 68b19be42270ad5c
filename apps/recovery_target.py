"""Checkpoint intervals chosen from a recovery-time objective (`[checkpoint] recovery_target`).

Owns: `RecoveryTarget`, which a `phalanx.apps.replica.Replica` consults instead of the fixed
`CheckpointPolicy.every_entries` / `every_bytes` triggers. It measures two rates and derives
the byte interval from them:

- the **load rate**: bytes of checkpoint loaded per second (`note_load`, timed by the replica
  around each checkpoint load; `DEFAULT_LOAD_RATE` until a load was seen);
- the **replay rate**: bytes of commands replayed per second (`note_apply`: the replica's
  replay time at a restart as it is, and its live apply time at `APPLY_TO_REPLAY` of its
  rate, since a replay also reads and decodes every entry; summed into samples of at least
  `SAMPLE_BYTES`; `DEFAULT_REPLAY_RATE` until then). Both are exponentially weighted
  averages.

The rule (docs/KV_STORAGE.md "Recovery-time objective"): a restart loads the newest durable
checkpoint (`checkpoint_bytes / load_rate` seconds) and replays the commands after it. A crash
just before a checkpoint completes replays the interval before that checkpoint plus what
arrived while it was written (`written_bytes`, measured per checkpoint: `note_written`;
assumed one interval until measured), so

    budget = replay_rate * (target - checkpoint_bytes / load_rate)
    interval = clamp(budget - written_bytes, MIN_INTERVAL_BYTES, MAX_INTERVAL_BYTES)

which is the rarest checkpointing (least overhead) that keeps load plus replay under the
target. When a checkpoint takes longer to write than an interval takes to fill, the next one
waits for it and the tail is `written_bytes` twice over: no interval helps then (`feasible`
is False; faster checkpoints or a longer target do). `MAX_INTERVAL_BYTES` bounds memory (a
Raft core holds the log since its newest checkpoint); `MIN_INTERVAL_BYTES` bounds overhead
when the target cannot be met because loading alone takes longer.

Invariants: pure and clock-free except for the injected `clock` (the runtime passes
`time.perf_counter`; tests a fake). The interval depends on measured wall time, so it differs
between replicas: only for protocols whose checkpoints are local decisions (Raft, the
leaderless core's byte trigger). PBFT's replicas certify checkpoints at fixed sequence numbers
(every K, the same K everywhere), so a measured rate cannot move them (`CheckpointPolicy.aligned`
policies ignore the target; docs/KV_STORAGE.md says why that costs nothing there).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_LOAD_RATE = 20e6
"""Bytes of checkpoint loaded per second before any load was measured (a node's first run):
at or below the KV app's load rate at 100k-1M keys on a loaded 2-core machine
(bench/recovery_target.py), so the first interval errs towards recovering fast."""
DEFAULT_REPLAY_RATE = 2e6
"""Bytes of commands replayed per second before any was measured: below the KV app's replay
rate for 256-byte puts on the same machine (bench/recovery_target.py)."""
APPLY_TO_REPLAY = 0.4
"""A live apply's rate counts at this share: the apply time the replica measures leaves out
what a restart's replay also pays per entry (reading the WAL, decoding the entry). The bench
measured restart replay at 0.3-0.6 of the live apply rate (256-byte puts, a loaded 2-core
machine); a restart's own replay sample enters the average as it is."""
SAMPLE_BYTES = 32 << 10
"""Timed command bytes summed into one replay-rate sample (smooths per-entry timer noise;
the replica times one entry in `phalanx.apps.replica.TIMED_EVERY`, so ~256 KiB applied)."""
WEIGHT = 0.25
"""Weight of a new sample in the exponentially weighted rates."""
MIN_INTERVAL_BYTES = 256 << 10
MAX_INTERVAL_BYTES = 256 << 20
REPLAY_SHARE = 0.5
"""Until a checkpoint's write was measured, the share of the replay budget one interval may
take (the bytes applied during a write are assumed to be another interval)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RecoveryEstimate:
    """What `RecoveryTarget` believes now (for status, logs and the bench)."""

    target_seconds: float
    load_rate: float
    """Bytes of checkpoint loaded per second."""
    replay_rate: float
    """Bytes of commands replayed per second."""
    checkpoint_bytes: int
    """Size of the newest durable checkpoint."""
    load_seconds: float
    interval_bytes: int
    written_bytes: float
    """Command bytes applied while a checkpoint is written (measured, or assumed)."""
    worst_seconds: float
    """Load plus the replay of a crash during a checkpoint's write: the recovery time the
    interval allows."""
    feasible: bool
    """The target can be held: the budget covers `written_bytes` twice and a minimal
    interval."""


class RecoveryTarget:
    """Measured rates and the checkpoint interval they allow (module docstring).

    Args:
        target_seconds: the recovery-time objective (load plus replay at restart), > 0.
        clock: monotonic seconds, read by the replica around applies and loads.
        load_rate, replay_rate: starting rates (bytes/s) until measurements replace them.
    """

    def __init__(self, target_seconds: float, *, clock: Callable[[], float],
                 load_rate: float = DEFAULT_LOAD_RATE,
                 replay_rate: float = DEFAULT_REPLAY_RATE,
                 min_bytes: int = MIN_INTERVAL_BYTES,
                 max_bytes: int = MAX_INTERVAL_BYTES) -> None:
        if not (math.isfinite(target_seconds) and target_seconds > 0):
            raise ValueError(f"recovery target must be a positive number of seconds, "
                             f"got {target_seconds!r}")
        if not (load_rate > 0 and replay_rate > 0 and 0 < min_bytes <= max_bytes):
            raise ValueError("recovery target rates must be > 0 and 0 < min_bytes <= "
                             f"max_bytes: {load_rate!r}, {replay_rate!r}, {min_bytes}, "
                             f"{max_bytes}")
        self.target_seconds = float(target_seconds)
        self.clock = clock
        self._load_rate = float(load_rate)
        self._replay_rate = float(replay_rate)
        self._min = min_bytes
        self._max = max_bytes
        self._checkpoint_bytes = 0
        self._written: float | None = None  # bytes applied during a write, weighted
        self.written_samples = 0
        self._pending_bytes = 0  # applied bytes not yet in a replay-rate sample
        self._pending_seconds = 0.0
        self.load_samples = 0
        self.replay_samples = 0
        self._interval = self._compute()

    # ------------------------------------------------------------------ measurements

    def note_load(self, nbytes: int, seconds: float) -> None:
        """A checkpoint of `nbytes` was loaded in `seconds`; it is the newest durable one."""
        self._checkpoint_bytes = nbytes
        if nbytes > 0 and seconds > 0:
            self._load_rate = _blend(self._load_rate, nbytes / seconds, self.load_samples)
            self.load_samples += 1
        self._interval = self._compute()

    def note_apply(self, nbytes: int, seconds: float, *, replay: bool = False) -> None:
        """Commands of `nbytes` were applied live (or, `replay`, replayed from the WAL at a
        restart) in `seconds`."""
        self._pending_bytes += nbytes
        self._pending_seconds += seconds if replay else seconds / APPLY_TO_REPLAY
        if self._pending_bytes >= SAMPLE_BYTES and self._pending_seconds > 0:
            rate = self._pending_bytes / self._pending_seconds
            self._replay_rate = _blend(self._replay_rate, rate, self.replay_samples)
            self.replay_samples += 1
            self._pending_bytes, self._pending_seconds = 0, 0.0
            self._interval = self._compute()

    def note_written(self, nbytes: int) -> None:
        """`nbytes` of commands were applied while the checkpoint just completed was written
        (the tail a crash during its write would have replayed on top of an interval)."""
        self._written = _blend(self._written or 0.0, float(nbytes), self.written_samples)
        self.written_samples += 1
        self._interval = self._compute()

    def note_checkpoint(self, nbytes: int) -> None:
        """A checkpoint of `nbytes` became durable: a restart would load it."""
        if nbytes != self._checkpoint_bytes:
            self._checkpoint_bytes = nbytes
            self._interval = self._compute()

    # ------------------------------------------------------------------ decisions

    @property
    def interval_bytes(self) -> int:
        """Command bytes between checkpoints (module docstring), cached between samples."""
        return self._interval

    def due(self, bytes_since: int) -> bool:
        """Whether `bytes_since` command bytes since the last checkpoint call for one."""
        return bytes_since >= self._interval

    def estimate(self) -> RecoveryEstimate:
        load = self._checkpoint_bytes / self._load_rate
        interval = self._interval
        budget = self._budget(load)
        written = self._written_bytes(budget)
        return RecoveryEstimate(
            target_seconds=self.target_seconds, load_rate=self._load_rate,
            replay_rate=self._replay_rate, checkpoint_bytes=self._checkpoint_bytes,
            load_seconds=load, interval_bytes=interval, written_bytes=written,
            worst_seconds=load + (max(interval, written) + written) / self._replay_rate,
            feasible=budget - written >= max(self._min, written))

    def _budget(self, load_seconds: float) -> float:
        """Command bytes a restart may replay after loading the checkpoint."""
        return max(0.0, self.target_seconds - load_seconds) * self._replay_rate

    def _written_bytes(self, budget: float) -> float:
        return budget * REPLAY_SHARE if self._written is None else self._written

    def _compute(self) -> int:
        budget = self._budget(self._checkpoint_bytes / self._load_rate)
        raw = budget - self._written_bytes(budget)
        return int(min(self._max, max(self._min, raw)))


def _blend(old: float, sample: float, seen: int) -> float:
    """The first measurement replaces the default; later ones are weighted by `WEIGHT`."""
    return sample if seen == 0 else old + WEIGHT * (sample - old)
