"""GP interval splitting over a seeded permutation: one node's share of every wave.

Owns: `WaveKey`, `Wave` (one wave's state at this node: its rumors, permutation, the
intervals of positions this node still owns, the positions it has claimed) and `Spreader`
(all waves of one node, the choice of the next call, the outcome of a call).

Ref: protocols.md §3.2 (Gasieniec-Pelc with random labels, after Doerr, Doerr, Moran,
Moran). Node v repeats while it owns an interval [a, b): m = (a+b)//2, call u = π(m) with
[m+1, b); if u acknowledges, v keeps [a, m), otherwise it keeps [a, m) and [m+1, b). When
b - a = 1 this is "call π(a) with an empty range". One call at a time per node.

Invariants:
- A position is claimed at a node when the node first owns it, and a grant only adds
  positions not yet claimed there, so overlapping or
  replayed grants (a slow callee that missed its timeout, a Byzantine caller) never make a
  node contact anyone twice in a wave; in a run without false timeouts the intervals of
  all nodes stay disjoint and the wave costs exactly n-1 calls, dead callees included.
- A call's interval is out of `intervals` while the call is pending and comes back on its
  outcome (with `early_keep`, its kept half [a, m) at once, [m+1, b) on a timeout), so
  nothing is lost: every position is eventually called by someone, whatever
  the crash set (a crashed caller takes its intervals with it, but a crashed node never
  acknowledged, so its caller kept them).
- A node keeps state (a `Wave`) only for the waves it owns positions of: a grant of no
  positions (a leaf call's) of an unknown wave is checked and accepted without any, since
  such a callee calls no one; a later grant of positions of that wave still starts it.
- `leaf_span` (0: off, GP verbatim): an interval of at most that many positions is not
  split at its midpoint but called position by position, each call with an EMPTY grant
  ([0, 0), one object per wave: `Wave.leaf_grant`; the caller keeps [a+1, b) whatever
  the outcome): the same n-1 contacts, the same
  every-position-called-once invariant, a shallower tree, and (with `early_keep`) no
  ack needed, since an empty grant's outcome changes nothing (`PlannedCall.ack`).
- `overlapping_intervals` (a test-only bug switch) gives the callee [(a+m)//2, b) instead
  of [m+1, b) (a leaf call: [a, b) instead of nothing), overlapping what the caller keeps:
  those positions are called twice, and the n-1 sweep must catch it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from phalanx.consensus.types import NodeId
from phalanx.gossip.messages import Grant, Rumor, wave_seed
from phalanx.gossip.permutation import Others, Permutation
from phalanx.gossip.rumors import SeenLog


class WaveKey(NamedTuple):
    origin: NodeId
    incarnation: int
    wave: int
    instance: int


@dataclass(slots=True)
class Wave:
    key: WaveKey
    seed: bytes
    rumors: tuple[Rumor, ...]
    others: Others
    perm: Permutation
    first_seen: int
    claimed: bytearray
    order: int = 0
    """Creation number at this node: `plan` serves waves oldest first."""
    intervals: list[tuple[int, int]] = field(default_factory=list)
    leaf_grant: Grant | None = None
    """The grant of this wave's leaf calls from this node (empty, [0, 0)): one object for
    all of them while the rumors stay the same, so the calls that carry it can be too."""
    next_call: tuple[int, int, int, NodeId] | None = None
    """`next_split` and the node its position names, as of the last time `intervals`
    changed (valid while `next_fresh`): what `Spreader.plan` compares to find riders, so
    a wave whose intervals did not change costs it no split and no permutation lookup."""
    next_fresh: bool = False
    """False whenever `intervals` changes (every change goes through this module)."""

    def next_split(self, leaf_span: int = 0) -> tuple[int, int, int] | None:
        """(a, b, m) of the interval this wave would split next (the largest, then lowest)
        and the position m it calls: its midpoint, or a when it spans at most `leaf_span`
        positions (a leaf call: empty grant)."""
        intervals = self.intervals
        if not intervals:
            return None
        if len(intervals) == 1:
            a, b = intervals[0]
        else:
            a, b = min(intervals, key=_largest_lowest)
        return a, b, (a if b - a <= leaf_span else (a + b) // 2)

    def own(self, lo: int, hi: int) -> None:
        """Take ownership of the unclaimed positions of [lo, hi), as maximal runs; they are
        claimed from now on (owned, called, or handed on: never owned twice)."""
        claimed = self.claimed
        if lo >= hi:
            return
        self.next_fresh = False
        if claimed.find(1, lo, hi) < 0:  # the common case (disjoint grants): one run
            claimed[lo:hi] = b"\x01" * (hi - lo)
            self.intervals.append((lo, hi))
            return
        start = None
        for pos in range(lo, hi):
            if claimed[pos]:
                if start is not None:
                    self.intervals.append((start, pos))
                    start = None
            else:
                claimed[pos] = 1
                if start is None:
                    start = pos
        if start is not None:
            self.intervals.append((start, hi))


def _largest_lowest(iv: tuple[int, int]) -> tuple[int, int]:
    return iv[0] - iv[1], iv[0]


class Part(NamedTuple):
    """One grant inside a pending call: wave `key`'s interval [a, b) split at m, or (when
    `whole`, the `balance` option) all of [a, b) handed over, or (when `leaf`, m == a) a
    leaf call: π(a) is called with an empty grant and the caller keeps [a+1, b)."""

    key: WaveKey
    a: int
    b: int
    m: int
    whole: bool = False
    kept: bool = False
    """What the caller keeps whatever the outcome ([a, m), or a leaf's [a+1, b)) went back
    to it when the call was planned (`early_keep`)."""
    leaf: bool = False

    @property
    def empty(self) -> bool:
        """The grant hands over no position (a leaf call, or a split of b - a <= 2)."""
        return not self.whole and (self.leaf or self.m + 1 >= self.b)


class PlannedCall(NamedTuple):
    target: NodeId
    grants: tuple[Grant, ...]
    parts: tuple[Part, ...]
    ack: bool = True
    """False: nothing depends on the call's outcome (`early_keep`, every grant empty), so
    the callee is asked for no ack and the call is not pending."""


class Spreader:
    """Every wave one node takes part in."""

    __slots__ = ("_active", "_created", "_member_set", "_members", "balance", "early_keep",
                 "instances", "leaf_span", "node_id", "overlapping_intervals", "permute",
                 "seen", "ttl", "waves")

    def __init__(self, node_id: NodeId, members: Sequence[NodeId], *, ttl: int,
                 instances: int = 1, permute: bool = True, balance: bool = False,
                 overlapping_intervals: bool = False, early_keep: bool = False,
                 leaf_span: int = 0) -> None:
        self.node_id = node_id
        self.early_keep = early_keep
        self.leaf_span = leaf_span
        self.instances = instances
        self.balance = balance
        self._members = tuple(sorted(members))
        self._member_set = frozenset(self._members)
        self.permute = permute
        self.ttl = ttl
        self.overlapping_intervals = overlapping_intervals
        self.seen = SeenLog(ttl)
        self.waves: dict[WaveKey, Wave] = {}
        self._active: dict[WaveKey, Wave] = {}
        """The waves that may own intervals (a superset of those that do): `plan` looks
        only at these, in creation order, so finished waves kept for their `ttl` cost it
        nothing (it was O(waves held) per call)."""
        self._created = 0

    def _new_wave(self, key: WaveKey, seed: bytes, rumors: tuple[Rumor, ...],
                  now: int) -> Wave:
        others = Others(self._members, key.origin)
        wave = Wave(key=key, seed=seed, rumors=rumors, others=others,
                    perm=Permutation(seed, len(others), identity=not self.permute),
                    first_seen=now, claimed=bytearray(len(others)), order=self._created)
        self._created += 1
        self.waves[key] = wave
        self.seen.add((key.origin, key.instance), key.incarnation, key.wave, now)
        return wave

    def start(self, key: WaveKey, rumors: tuple[Rumor, ...], now: int) -> Wave:
        """Our own new wave (we are its origin): we own every position."""
        seed = wave_seed(key.origin, key.incarnation, key.wave, key.instance, rumors[0].seed)
        wave = self._new_wave(key, seed, rumors, now)
        wave.own(0, len(wave.others))
        self._active[key] = wave
        return wave

    def accept(self, grant: Grant, now: int) -> str:
        """Take a grant whose rumors the caller already verified. Returns "ok" or the
        reason it is dropped ("bad_grant": not one signed batch of another member's, or an
        instance we do not run; "bad_range", "bad_seed", "seed_mismatch", "stale_wave")."""
        origin = grant.origin
        if origin == self.node_id or origin not in self._member_set or not grant.rumors or any(
            r.origin != origin or r.incarnation != grant.incarnation or r.wave != grant.wave
            or r.seed != grant.rumors[0].seed for r in grant.rumors
        ) or grant.instance >= self.instances:
            return "bad_grant"
        if grant.hi > len(self._members) - 1:
            return "bad_range"
        key = WaveKey(origin, grant.incarnation, grant.wave, grant.instance)
        wave = self.waves.get(key)
        if grant.seed != wave_seed(origin, grant.incarnation, grant.wave, grant.instance,
                                   grant.rumors[0].seed):
            return "bad_seed"
        if wave is None:
            if self.seen.classify((origin, grant.instance), grant.incarnation,
                                  grant.wave) != "fresh":
                return "stale_wave"
            if grant.lo == grant.hi:
                # Nothing to own (a leaf call's empty grant: most callees of a wave): no
                # wave state, which only a node that calls someone needs. A later grant of
                # positions in this wave still finds it fresh and starts it then.
                return "ok"
            wave = self._new_wave(key, grant.seed, grant.rumors, now)
        elif grant.seed != wave.seed:
            return "seed_mismatch"  # two seeds signed for one wave: the origin equivocates
        elif grant.rumors != wave.rumors:  # a forwarder dropped some: forward them all
            merged = {r.seq: r for r in (*grant.rumors, *wave.rumors)}
            wave.rumors = tuple(merged[seq] for seq in sorted(merged))
        wave.own(grant.lo, grant.hi)
        if wave.intervals:
            self._active[key] = wave
        return "ok"

    def plan(self) -> PlannedCall | None:
        """The next call: the oldest wave with work splits its largest interval; every other
        wave whose next split calls the same node rides along. Claims and removes the
        intervals; `resolve` gives them back. Positions naming this node are skipped."""
        busy = self._busy()
        me = self.node_id
        for key, wave in busy:
            nxt = wave.next_call if wave.next_fresh else self._next_call(wave)
            while nxt is not None and nxt[3] == me:
                a, b, m, _ = nxt
                wave.intervals.remove((a, b))  # our own position: owned, never called
                wave.intervals.extend(iv for iv in ((a, m), (m + 1, b)) if iv[0] < iv[1])
                nxt = self._next_call(wave)
            if nxt is None:
                continue
            a, b, m, target = nxt
            split = (a, b, m)
            parts = [self._take(wave, a, b, m)]
            if self.balance and not parts[0].leaf:
                parts += self._handoff(wave, split)
            if len(busy) > 1:
                for other_key, other in busy:
                    if other_key == key:
                        continue
                    nxt = other.next_call if other.next_fresh else self._next_call(other)
                    if nxt is not None and nxt[3] == target:
                        parts.append(self._take(other, nxt[0], nxt[1], nxt[2]))
            grants = tuple(self._grant(p) for p in parts)
            if self.early_keep:  # what we keep whatever the outcome is ours again now
                for i, part in enumerate(parts):
                    if not part.whole:
                        kept = (part.m + 1, part.b) if part.leaf else (part.a, part.m)
                        if kept[0] < kept[1]:
                            kept_wave = self.waves[part.key]
                            kept_wave.intervals.append(kept)
                            kept_wave.next_fresh = False
                            self._active[part.key] = kept_wave
                        # `part._replace(kept=True)`, without its per-call keyword walk
                        parts[i] = Part(part.key, part.a, part.b, part.m, part.whole, True,
                                        part.leaf)
                ack = not parts[0].empty if len(parts) == 1 else not all(
                    part.empty for part in parts)
            else:
                ack = True
            return PlannedCall(target=target, grants=grants, parts=tuple(parts), ack=ack)
        return None

    def _next_call(self, wave: Wave) -> tuple[int, int, int, NodeId] | None:
        """`wave.next_call`, computed again (its intervals changed since)."""
        split = wave.next_split(self.leaf_span)
        nxt = None if split is None else (*split, wave.others[wave.perm(split[2])])
        wave.next_call = nxt
        wave.next_fresh = True
        return nxt

    def _handoff(self, wave: Wave, split: tuple[int, int, int]) -> list[Part]:
        """The `balance` option: besides [m+1, b), hand the callee whole intervals, largest
        first, while that brings its share closer to ours (same wave, same call: no extra
        contact, intervals stay disjoint). After failed calls a node holds many intervals;
        plain GP leaves them all to it, which is what makes heavy crash rates slow."""
        a, b, m = split
        mine, theirs = m - a + sum(hi - lo for lo, hi in wave.intervals), b - m - 1
        out = []
        for lo, hi in sorted(wave.intervals, key=lambda iv: (iv[0] - iv[1], iv[0])):
            size = hi - lo
            if abs((mine - size) - (theirs + size)) >= abs(mine - theirs):
                break
            wave.intervals.remove((lo, hi))
            wave.next_fresh = False
            mine, theirs = mine - size, theirs + size
            out.append(Part(wave.key, lo, hi, lo, whole=True))
        return out

    def _take(self, wave: Wave, a: int, b: int, m: int) -> Part:
        wave.intervals.remove((a, b))
        wave.next_fresh = False
        return Part(wave.key, a, b, m, leaf=m == a and b - a <= self.leaf_span)

    def _grant(self, part: Part) -> Grant:
        wave = self.waves[part.key]
        hi = part.b
        if part.whole:
            lo = part.a
        elif part.leaf:
            if self.overlapping_intervals:
                lo = part.a
            else:  # every leaf grant of the wave is the same empty one
                grant = wave.leaf_grant
                if grant is None or grant.rumors is not wave.rumors:
                    grant = wave.leaf_grant = Grant(
                        origin=part.key.origin, incarnation=part.key.incarnation,
                        wave=part.key.wave, instance=part.key.instance, seed=wave.seed,
                        lo=0, hi=0, rumors=wave.rumors)
                return grant
        else:
            lo = (part.a + part.m) // 2 if self.overlapping_intervals else part.m + 1
        return Grant(origin=part.key.origin, incarnation=part.key.incarnation,
                     wave=part.key.wave, instance=part.key.instance, seed=wave.seed,
                     lo=lo, hi=hi, rumors=wave.rumors)

    def resolve(self, parts: tuple[Part, ...], acked: bool) -> None:
        """A call's outcome: acknowledged (the callee owns [m+1, b)) or timed out (we keep
        it: [m+1, b) comes back to us; its positions stayed claimed by us)."""
        for part in parts:
            wave = self.waves.get(part.key)
            if wave is None:
                continue
            held = len(wave.intervals)
            self._resolve(wave, part, acked)
            if len(wave.intervals) > held:  # (a wave that got nothing back stays idle)
                self._active[part.key] = wave

    @staticmethod
    def _resolve(wave: Wave, part: Part, acked: bool) -> None:
        wave.next_fresh = False
        if part.whole:
            if not acked:
                wave.intervals.append((part.a, part.b))
            return
        if part.leaf:  # [a+1, b) is ours whatever the outcome
            if not part.kept and part.m + 1 < part.b:
                wave.intervals.append((part.m + 1, part.b))
            return
        if part.a < part.m and not part.kept:
            wave.intervals.append((part.a, part.m))
        if not acked and part.m + 1 < part.b:
            wave.intervals.append((part.m + 1, part.b))

    def _busy(self) -> list[tuple[WaveKey, Wave]]:
        """The waves owning intervals, oldest first (as `waves` orders them); the active
        index forgets the others."""
        active = self._active
        if not active:  # (no wave owns intervals: most plans of an idle node)
            return []
        if len(active) == 1:  # the common case
            for key, wave in active.items():
                if wave.intervals:
                    return [(key, wave)]
            active.clear()
            return []
        for key in [k for k, w in active.items() if not w.intervals]:
            del active[key]
        if len(active) > 1:
            return sorted(active.items(), key=lambda kw: kw[1].order)
        return list(active.items())

    def busy(self) -> bool:
        return any(w.intervals for w in self._active.values())

    def collect(self, now: int) -> None:
        """Forget finished waves older than `ttl` (their numbers stay in the seen-log)."""
        old = [k for k, w in self.waves.items()
               if not w.intervals and now - w.first_seen > self.ttl]
        for key in old:
            del self.waves[key]
            self._active.pop(key, None)
        self.seen.collect(now)
