"""Per-follower replication progress and flow control (after etcd's tracker, §3.5, §10.2.1).

Owns: `Progress` (what the leader knows of one follower: match, next, state, in-flight
window) and `Inflights` (a bounded window of unacknowledged AppendEntries).

Rules:
- Pure: imports only the standard library. The leader creates, updates and discards these.
- States (etcd's `tracker/state.go`):
  * PROBE: the leader does not know where the follower's log matches. It sends one
    AppendEntries at a time and waits (``paused``) for an answer or a heartbeat response.
  * REPLICATE: the follower's log matches up to `match`; the leader streams entries
    optimistically (`next` advances on send) while `inflights` has room (pipelining).
  * SNAPSHOT: the follower needs an InstallSnapshot; entries are not sent until it completes.
    The snapshot being sent is pinned in `snapshot` (a newer checkpoint does not replace it)
    and goes out as a window of chunks: `snapshot_offset` is what the follower acknowledged,
    `snapshot_sent` how far the leader has sent; `snapshot_sent - snapshot_offset` never
    exceeds the window (one chunk until the follower's first answer says where it is).
- Invariants: 0 <= match < next; in REPLICATE, inflight indexes are ascending and <= next - 1.
"""

from __future__ import annotations

import enum
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (a type only: this module imports nothing but the standard library)
    from phalanx.consensus.core import Snapshot

STALL_LIMIT = 2
"""Heartbeat answers without progress that mean a lost window, for a follower that answers
AppendEntries faster than the heartbeat interval (the floor of `Progress.stall_threshold`)."""


def stall_limit(election_ticks: int, heartbeat_ticks: int) -> int:
    """The most heartbeat answers without progress a REPLICATE window is given, however slow
    its follower has been: about two election timeouts' worth, never fewer than
    `STALL_LIMIT`."""
    if election_ticks < 1 or heartbeat_ticks < 1:
        raise ValueError("election_ticks and heartbeat_ticks must be >= 1")
    return max(STALL_LIMIT, -(-2 * election_ticks // heartbeat_ticks))


SNAPSHOT_MAX_BACKOFF = 3
"""Snapshot retransmissions in a row double the timeout at most this many times (8x)."""


class ProgressState(enum.Enum):
    PROBE = "probe"
    REPLICATE = "replicate"
    SNAPSHOT = "snapshot"


class Inflights:
    """A bounded FIFO of the last index of every AppendEntries sent and not yet acknowledged."""

    __slots__ = ("_q", "capacity")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"inflight capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._q: deque[int] = deque()

    def full(self) -> bool:
        return len(self._q) >= self.capacity

    def count(self) -> int:
        return len(self._q)

    def add(self, last_index: int) -> None:
        if self.full():
            raise ValueError("inflights window is full")
        self._q.append(last_index)

    def free_le(self, index: int) -> None:
        """Forget every in-flight message whose last index is <= `index` (acknowledged)."""
        q = self._q
        while q and q[0] <= index:
            q.popleft()

    def reset(self) -> None:
        self._q.clear()


class Progress:
    """What the leader knows about one follower's log."""

    __slots__ = (
        "inflights",
        "lag",
        "match",
        "next",
        "paused",
        "quiet",
        "recent_active",
        "snapshot",
        "snapshot_backoff",
        "snapshot_index",
        "snapshot_known",
        "snapshot_last_out",
        "snapshot_offset",
        "snapshot_quiet",
        "snapshot_sent",
        "stall_limit",
        "stalled",
        "state",
    )

    def __init__(self, *, next_index: int, max_inflight: int,
                 stall_limit: int = STALL_LIMIT) -> None:
        if stall_limit < 1:
            raise ValueError(f"stall_limit must be >= 1, got {stall_limit}")
        self.stall_limit = stall_limit
        self.match = 0
        self.next = next_index
        # Invariant: match < next.
        self.state = ProgressState.PROBE
        self.paused = False
        """PROBE only: an AppendEntries is outstanding; wait for its answer or a heartbeat."""
        self.inflights = Inflights(max_inflight)
        self.recent_active = False
        """Heard from since the last check-quorum round (§6.2)."""
        self.snapshot: Snapshot | None = None
        """SNAPSHOT only: the snapshot being sent, pinned until the transfer ends."""
        self.snapshot_index = 0
        """SNAPSHOT only: the index of `snapshot`."""
        self.snapshot_offset = 0
        """SNAPSHOT only: the byte offset the follower acknowledged (it holds the prefix)."""
        self.snapshot_sent = 0
        """SNAPSHOT only: the byte offset up to which chunks were sent (since the last
        rewind); `snapshot_offset <= snapshot_sent`."""
        self.snapshot_last_out = False
        """SNAPSHOT only: the final chunk was sent (since the last rewind)."""
        self.snapshot_known = False
        """SNAPSHOT only: the follower answered once, so `snapshot_offset` is where it is
        (until then the window is one chunk: it may already hold a prefix)."""
        self.snapshot_quiet = 0
        """SNAPSHOT only: heartbeat answers since the acknowledged offset last advanced while
        chunks were outstanding (the retransmission timer)."""
        self.snapshot_backoff = 0
        """SNAPSHOT only: retransmissions in a row without progress (each doubles the
        timeout, up to `SNAPSHOT_MAX_BACKOFF` doublings)."""
        self.stalled = 0
        """REPLICATE only: heartbeat responses seen since `match` last advanced while entries
        were outstanding; at `stall_threshold` the leader assumes the window was lost."""
        self.quiet = 0
        """Heartbeat answers since `match` last advanced while it was behind (any state)."""
        self.lag = 0
        """How many heartbeat answers this follower's AppendEntries answers trail: the `quiet`
        count at the latest progress, decaying by one per progress once it is smaller."""

    def become_probe(self) -> None:
        if self.state is ProgressState.SNAPSHOT:
            self.next = max(self.match + 1, self.snapshot_index + 1)
        else:
            self.next = self.match + 1
        self.state = ProgressState.PROBE
        self.paused = False
        self.stalled = 0
        self.inflights.reset()
        self._reset_snapshot(None, 0)

    def heartbeat_acked(self, last_index: int) -> bool:
        """A heartbeat response arrived; True if REPLICATE made no progress for
        `stall_threshold()` heartbeats while entries were outstanding (their messages were
        probably lost).

        Answers to heartbeats that left before the window's AppendEntries precede its answer;
        `stall_threshold` allows for the follower's learnt `lag` of them.

        A full window alone is not a stall: a follower that acknowledges more slowly than
        clients propose keeps it full while making progress."""
        if self.match >= last_index:
            self.stalled = self.quiet = 0
            return False
        self.quiet += 1
        if self.state is not ProgressState.REPLICATE:
            self.stalled = 0
            return False
        self.stalled += 1
        return self.stalled >= self.stall_threshold()

    def stall_threshold(self) -> int:
        """Heartbeat answers without progress that count as a lost window for this follower:
        `STALL_LIMIT` more than its learnt `lag`, at most `stall_limit`."""
        return min(self.stall_limit, STALL_LIMIT + self.lag)

    def forget_after(self, match: int) -> None:
        """The follower lost its entries after `match` (a lost or repaired disk): match may
        go down here and only here; probe from `match + 1`."""
        self.match = min(self.match, match)
        self.become_probe()
        self.next = self.match + 1

    def become_replicate(self) -> None:
        self.state = ProgressState.REPLICATE
        self.next = self.match + 1
        self.paused = False
        self.inflights.reset()

    def become_snapshot(self, snapshot: Snapshot) -> None:
        self.state = ProgressState.SNAPSHOT
        self.paused = False
        self.inflights.reset()
        self._reset_snapshot(snapshot, snapshot.meta.index)

    def _reset_snapshot(self, snapshot: Snapshot | None, index: int) -> None:
        self.snapshot = snapshot
        self.snapshot_index = index
        self.snapshot_offset = self.snapshot_sent = 0
        self.snapshot_last_out = self.snapshot_known = False
        self.snapshot_quiet = self.snapshot_backoff = 0

    def snapshot_acked(self, next_offset: int) -> bool:
        """The follower answered a chunk: it holds `next_offset` bytes. True if that is news:
        the first answer, more than acknowledged before, or less (the follower lost its
        prefix, e.g. it restarted: sending goes back there). The same offset again (an
        answer to a duplicate or to a chunk after a gap) changes nothing: only the timeout
        resends, so duplicate answers can never multiply the transfer."""
        if self.snapshot_known and next_offset == self.snapshot_offset:
            return False
        if next_offset < self.snapshot_offset or self.snapshot_sent < next_offset:
            self.snapshot_sent = next_offset
            self.snapshot_last_out = False
        self.snapshot_known = True
        self.snapshot_offset = next_offset
        self.snapshot_quiet = self.snapshot_backoff = 0
        return True

    def snapshot_heartbeat(self) -> bool:
        """A heartbeat answer arrived while in SNAPSHOT; True if the outstanding chunks are
        presumed lost and must be sent again from `snapshot_offset` (the timeout: `stall_limit`
        answers without progress, doubled per retransmission in a row). Heartbeat answers
        travel behind the chunks on the same ordered link, so the timer runs only once the
        follower has processed (or never got) what was sent before them: it is measured
        behind the window, whatever its size."""
        if self.snapshot_sent <= self.snapshot_offset and not self.snapshot_last_out:
            self.snapshot_quiet = 0
            return False
        self.snapshot_quiet += 1
        if self.snapshot_quiet < self.stall_limit << self.snapshot_backoff:
            return False
        self.snapshot_quiet = 0
        self.snapshot_backoff = min(self.snapshot_backoff + 1, SNAPSHOT_MAX_BACKOFF)
        self.snapshot_sent = self.snapshot_offset
        self.snapshot_last_out = False
        return True

    def is_blocked(self) -> bool:
        """Whether the leader must not send entries now (flow control)."""
        if self.state is ProgressState.PROBE:
            return self.paused
        if self.state is ProgressState.REPLICATE:
            inflights = self.inflights  # inflights.full(), inlined on the leader's hot path
            return len(inflights._q) >= inflights.capacity
        return True

    def maybe_update(self, match: int) -> bool:
        """A successful AppendEntriesResponse up to `match`; False if it is stale."""
        if match <= self.match:
            if match + 1 > self.next:  # pragma: no cover - defensive, cannot happen
                self.next = match + 1
            return False
        self.match = match
        self.next = max(self.next, match + 1)
        self.paused = False
        self.stalled = 0
        self.lag = max(self.quiet, self.lag - 1)
        self.quiet = 0
        self.inflights.free_le(match)
        return True

    def sent_entries(self, last: int) -> None:
        """Record an AppendEntries whose last entry is `last` (possibly empty: last = next-1)."""
        if self.state is ProgressState.REPLICATE:
            if last >= self.next:
                self.next = last + 1
                self.inflights.add(last)
        elif self.state is ProgressState.PROBE:
            self.paused = True

    def describe(self) -> str:
        extra = ""
        if self.state is ProgressState.REPLICATE:
            extra = f" inflight={self.inflights.count()}"
        elif self.state is ProgressState.SNAPSHOT:
            extra = f" snap={self.snapshot_index}"
        elif self.paused:
            extra = " paused"
        return f"match={self.match} next={self.next} {self.state.value}{extra}"
