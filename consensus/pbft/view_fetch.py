"""The ViewChanges a NewView names by digest: waiting for them, fetching them, serving them.

Owns: `ViewChangeFetch`: the NewViews a replica holds while some ViewChange they name is
missing (`Waiting`: at most one per primary, the latest view's; each with its fetch
schedule), the ViewChanges found for them that the replica does not hold as the latest from
their signer (`found`: at most `_FOUND_PER_SIGNER` per signer), the digests of held
ViewChanges (cached), and the answers to other replicas' `FetchViewChanges` (at most one per
peer and view per `fetch_ticks`). `view_flow.ViewChangeFlow` owns the latest ViewChange of
every replica and decides when a NewView is complete and entered; this module keeps none
of that.

Must not import: trio, sockets, clocks, randomness, `phalanx.net`.

Why (Castro-Liskov TOCS §5.2 / Castro's thesis §3.2.4): a NewView carrying 2f+1 whole
ViewChanges, each with a prepared certificate of 2f+1 signatures per seq, grows as n^2 per
seq (21 MB at n = 180); replicas already broadcast their ViewChange to all, so the NewView
names them by (replica, digest) and a backup fetches only what it lacks, from the signers
and the new primary (which holds every one it named), `view_change_fetch_ticks` after the
NewView arrived (most are then on their way) and every `fetch_ticks` after that.

Invariants (bounded memory under Byzantine input): at most one waiting NewView per primary
(a later view's, or a later copy, replaces it), so a Byzantine primary's NewView naming
digests no one can supply never displaces an honest primary's; waiting NewViews of views
the replica moved past (or entered) are dropped; a ViewChange is kept in `found` only if a
waiting NewView names its (replica, digest) and the flow verified it first, at most
`_FOUND_PER_SIGNER` per signer (a Byzantine signer evicts only its own); the digest cache
holds at most `_CACHE_PER_REPLICA` entries per replica. A NewView naming a digest no one
can supply only waits: the view-change timer moves the replica past its view, which drops it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from phalanx.consensus.pbft.messages import (
    FetchViewChanges,
    NewView,
    RelayedViewChange,
    ViewChange,
    ViewChangeRef,
)
from phalanx.consensus.pbft.shared import Shared
from phalanx.consensus.pbft.view_change import view_change_digest
from phalanx.consensus.types import NodeId

_CACHE_PER_REPLICA = 3
_FOUND_PER_SIGNER = 2


class Waiting:
    """A NewView whose header checked out, and when to fetch what it still lacks."""

    __slots__ = ("attempts", "next_fetch", "nv")

    def __init__(self, nv: NewView, *, next_fetch: int) -> None:
        self.nv = nv
        self.next_fetch = next_fetch
        self.attempts = 0


class ViewChangeFetch:
    """See the module docstring."""

    __slots__ = ("_digests", "_found", "_s", "_served", "waiting")

    def __init__(self, shared: Shared) -> None:
        self._s = shared
        self._digests: dict[NodeId, list[tuple[ViewChange, bytes]]] = {}
        self._found: dict[NodeId, list[ViewChange]] = {}
        self._served: dict[NodeId, tuple[int, int]] = {}
        self.waiting: dict[NodeId, Waiting] = {}  # by primary

    def digest(self, vc: ViewChange) -> bytes:
        """`view_change_digest(vc)`, cached for the last few ViewChanges of its signer (the
        same object: a NewView's check and the fetches it answers reuse one encoding)."""
        cached = self._digests.setdefault(vc.replica, [])
        for held, d in cached:
            if held is vc:
                return d
        d = view_change_digest(self._s.crypto, vc)
        cached.append((vc, d))
        del cached[:-_CACHE_PER_REPLICA]
        return d

    # ----------------------------------------------------------------------------------
    # NewViews waiting for their view changes

    def wait(self, nv: NewView) -> bool:
        """Hold `nv` (its header verified) until every view change it names is at hand;
        False (not held): its primary's waiting NewView is of a later view, or the same."""
        old = self.waiting.get(nv.replica)
        if old is not None and (old.nv.view > nv.view or old.nv == nv):
            return False
        self.waiting[nv.replica] = Waiting(
            nv, next_fetch=self._s.ticks + self._s.cfg.view_change_fetch_ticks
        )
        return True

    def forget(self, view: int, *, entered: bool) -> None:
        """The replica moved to `view` (`entered`: and entered it): drop the waiting
        NewViews of older views (and of `view` itself once entered), and the view changes
        found that none of the others names."""
        limit = view + 1 if entered else view
        for primary in sorted(self.waiting):
            if self.waiting[primary].nv.view < limit:
                del self.waiting[primary]
        if not self.waiting:
            self._found.clear()

    def by_view(self) -> list[Waiting]:
        """The waiting NewViews, lowest view first."""
        return sorted(self.waiting.values(), key=lambda w: (w.nv.view, w.nv.replica))

    def _named(self, vc: ViewChange) -> bool:
        d: bytes | None = None
        for w in self.waiting.values():
            if w.nv.view != vc.new_view:
                continue
            for ref in w.nv.view_changes:
                if ref.replica == vc.replica:
                    d = self.digest(vc) if d is None else d
                    if ref.digest == d:
                        return True
        return False

    def offer(self, vc: ViewChange) -> bool:
        """A verified ViewChange: keep it if a waiting NewView names it (True)."""
        if not self.waiting:
            return False
        kept = self._found.setdefault(vc.replica, [])
        if any(held is vc for held in kept) or not self._named(vc):
            return False
        kept.append(vc)
        del kept[:-_FOUND_PER_SIGNER]
        return True

    def _lookup(
        self, ref: ViewChangeRef, view: int, latest: dict[NodeId, ViewChange]
    ) -> ViewChange | None:
        candidates: list[ViewChange | None] = [latest.get(ref.replica)]
        candidates += self._found.get(ref.replica, ())
        for vc in candidates:
            if vc is not None and vc.new_view == view and self.digest(vc) == ref.digest:
                return vc
        return None

    def resolve(
        self, w: Waiting, latest: dict[NodeId, ViewChange]
    ) -> tuple[ViewChange, ...] | None:
        """The view changes `w`'s NewView names, in its order, from the latest ViewChange
        held from each signer and those found (None: one is still missing)."""
        out: list[ViewChange] = []
        for ref in w.nv.view_changes:
            vc = self._lookup(ref, w.nv.view, latest)
            if vc is None:
                return None
            out.append(vc)
        return tuple(out)

    def mismatched(self, nv: NewView, latest: dict[NodeId, ViewChange]) -> int:
        """How many view changes `nv` names by another digest than the one of the same view
        held from that signer (a Byzantine primary, a Byzantine signer that signed two, or an
        honest signer's newer one: a restart, a refreshed checkpoint)."""
        return sum(
            1 for ref in nv.view_changes
            if (held := latest.get(ref.replica)) is not None
            and held.new_view == nv.view and self.digest(held) != ref.digest
        )

    def tick(self, latest: dict[NodeId, ViewChange]) -> None:
        """Fetch what each waiting NewView still lacks when its time comes: from each signer
        its own, and all of them from the new primary (a Byzantine signer may have sent its
        ViewChange to some replicas only: the primary holds every one it named)."""
        s = self._s
        for w in self.by_view():
            if s.ticks < w.next_fetch:
                continue
            w.next_fetch = s.ticks + s.cfg.fetch_ticks
            view = w.nv.view
            missing = [
                ref for ref in w.nv.view_changes if self._lookup(ref, view, latest) is None
            ]
            if not missing:
                continue
            to_primary = w.nv.replica != s.me
            if to_primary:
                s.send(
                    w.nv.replica, FetchViewChanges(view=view, wanted=tuple(missing), replica=s.me)
                )
            for ref in missing:
                if ref.replica == s.me or (to_primary and ref.replica == w.nv.replica):
                    continue
                s.send(ref.replica, FetchViewChanges(view=view, wanted=(ref,), replica=s.me))
            w.attempts += 1

    # ----------------------------------------------------------------------------------
    # Answering fetches

    def serve(
        self,
        src: NodeId,
        msg: FetchViewChanges,
        held: Callable[[NodeId], Iterable[ViewChange | None]],
    ) -> None:
        """Send `src` each ViewChange it asks for that this replica holds (`held(replica)`:
        the candidates from that signer, besides those found), at most once per peer and
        view per `fetch_ticks`."""
        s = self._s
        last = self._served.get(src)
        if last is not None and last[0] == msg.view and s.ticks - last[1] < s.cfg.fetch_ticks:
            s.drop("view_change_fetch_too_soon")
            return
        self._served[src] = (msg.view, s.ticks)
        seen: set[NodeId] = set()
        for ref in msg.wanted[: s.cfg.n]:
            if ref.replica in seen:
                continue
            seen.add(ref.replica)
            candidates: list[ViewChange | None] = [*held(ref.replica)]
            candidates += self._found.get(ref.replica, ())
            for vc in candidates:
                if (
                    vc is not None and vc.replica == ref.replica and vc.new_view == msg.view
                    and self.digest(vc) == ref.digest
                ):
                    s.send(src, RelayedViewChange(view_change=vc, replica=s.me))
                    break

    def found(self, vc: ViewChange) -> bool:
        """Whether `vc` is one of those found (verified on arrival)."""
        return any(held == vc for held in self._found.get(vc.replica, ()))


def refs_of(fetch: ViewChangeFetch, vcs: tuple[ViewChange, ...]) -> tuple[ViewChangeRef, ...]:
    """V as a NewView names it: (replica, digest) of each view change, in order."""
    return tuple(ViewChangeRef(replica=vc.replica, digest=fetch.digest(vc)) for vc in vcs)
