"""Abort certificates: signed refusals that prove a transaction can never commit.

Owns: `RefusalTally`, the refusals collected per transaction and the certificate threshold.
Pure: the caller verifies every `Refusal`'s signature (and that its endorser is a member)
before `add`, and keeps decided transactions out (their tombstones) after `forget`.

Why n-Q+1+f refusals are an abort certificate. A correct node signs a `Refusal` of T only
when it has not endorsed T and T's deadline passed on its clock; its safety kernel then
never endorses T (across restarts too). Take k = n-Q+1+f refusals from distinct nodes: at
most f of them are Byzantine, so at least n-Q+1 come from correct nodes that never endorsed
T and never will. Every endorsement of T, past or future, therefore comes from the other
at most n-(n-Q+1) = Q-1 nodes, and T can never gather the Q endorsements from distinct
nodes it needs to commit anywhere. A certificate for the base quorum Q also holds for any
policy quorum Q_policy >= Q (fewer possible endorsers than it needs); so the tally uses
the base Q. At n = 3f+1 (Q = 2f+1) the threshold is 2f+1, which n-f correct nodes reach
without any Byzantine help; in general n-Q+1+f <= n-f because Q >= 2f+1.

The same count admits endorsements one of whose conditions committed (a correct node signs
one endorsement of T, never with a refusal, and such an endorsement is definitely valid at
no correct node): the core counts those endorsers with the refusers (`intake.py`
`_check_certificate`, `Rules.dead`; docs/LEADERLESS.md "Dead endorsements abort").

Invariants: at most one refusal per endorser per transaction (the first kept); memory is
one entry per tracked transaction until `forget`.
"""

from __future__ import annotations

from phalanx.consensus.leaderless.messages import Refusal, TxId
from phalanx.consensus.types import LocalProtocolError, NodeId


def abort_threshold(*, n: int, f: int, quorum: int) -> int:
    """How many refusals from distinct nodes prove that no Q-set of endorsers can exist:
    n-quorum+1+f (see the module docstring)."""
    return n - quorum + 1 + f


class RefusalTally:
    """Collects refusals per transaction; reports an abort certificate once enough distinct
    nodes refused."""

    __slots__ = ("_by_tx", "threshold")

    def __init__(self, *, n: int, f: int, quorum: int) -> None:
        if n < 1 or f < 0 or not f + 1 <= quorum <= n:
            raise LocalProtocolError(
                f"RefusalTally needs n >= 1, f >= 0 and f+1 <= quorum <= n (n={n} f={f} "
                f"quorum={quorum})")
        self.threshold = abort_threshold(n=n, f=f, quorum=quorum)
        if self.threshold > n:
            raise LocalProtocolError(
                f"no abort certificate exists for n={n} f={f} quorum={quorum}: "
                f"it needs {self.threshold} > n refusals")
        self._by_tx: dict[TxId, dict[NodeId, Refusal]] = {}

    def add(self, refusal: Refusal) -> None:
        """Record a verified refusal; a second one by the same endorser is ignored."""
        refusers = self._by_tx.setdefault(refusal.tx_id, {})
        refusers.setdefault(refusal.endorser, refusal)

    def holds(self, refusal: Refusal) -> bool:
        """This very refusal (signature included) is already tallied: a re-send."""
        refusers = self._by_tx.get(refusal.tx_id)
        return refusers is not None and refusers.get(refusal.endorser) == refusal

    def count(self, tx_id: TxId) -> int:
        """How many distinct nodes refused `tx_id`."""
        return len(self._by_tx.get(tx_id, ()))

    def refusals(self, tx_id: TxId) -> tuple[Refusal, ...]:
        """The refusals of `tx_id` held, one per refusing node (sorted by node)."""
        refusers = self._by_tx.get(tx_id, {})
        return tuple(refusers[node] for node in sorted(refusers))

    def certificate(self, tx_id: TxId) -> tuple[Refusal, ...] | None:
        """`threshold` refusals of `tx_id` from distinct nodes (the lowest endorser ids, sorted),
        or None while fewer nodes refused it."""
        refusers = self._by_tx.get(tx_id)
        if refusers is None or len(refusers) < self.threshold:
            return None
        return tuple(refusers[node] for node in sorted(refusers)[: self.threshold])

    def forget(self, tx_id: TxId) -> None:
        """Drop everything about `tx_id` (decided or collected)."""
        self._by_tx.pop(tx_id, None)

    def __len__(self) -> int:
        return len(self._by_tx)
