"""The amnesia fence of the leaderless core (docs/LEADERLESS.md "Amnesia fence").

Owns: `Fence`, whether this node may sign anything now. A node that lost its durable record
(`recovering` at construction: the runtime's amnesia verdict) no longer knows which
endorsements, refusals and veto votes it signed, so it could sign one that conflicts with a
lost one. It signs nothing until its clock passes `restart + max_deadline_lead_ms +
gc_horizon_ms`, where `restart` is the first clock reading after the restart: before the
loss it endorsed only transactions whose deadline was at most `max_deadline_lead_ms` past its
clock (earlier than `restart`), so at the fence's end every one of them lies beyond every
node's garbage-collection horizon (ignored, as a node that kept its record would have
forgotten its own signatures by then). Meanwhile it fetches, commits and applies (commit
certificates are self-certifying) and answers clients.

Invariants: `until_ms` only grows; it is part of the durable record
(`LeaderlessDurableState.fence_until_ms`), so a crash during the fence keeps it (and the
runtime's IDENTITY stays ``recovering`` until `active` turns False, so the next start is
fenced again); no clock reading yet while pending means fenced.
"""

from __future__ import annotations


class Fence:
    __slots__ = ("_length", "pending", "until_ms")

    def __init__(self, *, recovering: bool, restored_until_ms: int, length_ms: int) -> None:
        self._length = length_ms
        self.pending = recovering
        """Amnesia: the fence starts at the first clock reading."""
        self.until_ms = restored_until_ms

    def on_clock(self, now: int) -> bool:
        """Read the clock; True when the fence was just set (the record must be written)."""
        if not self.pending:
            return False
        self.pending = False
        self.until_ms = max(self.until_ms, now + self._length)
        return True

    def active(self, now: int | None) -> bool:
        """Whether this node must sign nothing at `now` (None: no clock reading yet)."""
        if self.pending:
            return True
        return self.until_ms > 0 and (now is None or now < self.until_ms)
