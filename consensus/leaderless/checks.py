"""Checks of peer and client input for the leaderless core: what is well-formed and signed.

Owns: `tx_problem`, `refusal_problem` (each the drop reason, or None when the input is
acceptable; `endorsement_problem` lives with the batch format in `endorsement_batch.py` and
is re-exported here) and `ProofChecker` (the veto procedure's proof check).
Pure functions of their arguments; nothing here raises on hostile input.
"""

from __future__ import annotations

from collections.abc import Callable

from phalanx.consensus.crypto import Verifier
from phalanx.consensus.leaderless.endorsement_batch import VerifiedRoots, endorsement_problem
from phalanx.consensus.leaderless.messages import (
    Endorsement,
    Refusal,
    Requirement,
    Transaction,
    TransactionProof,
    TxId,
)
from phalanx.consensus.types import NodeId

__all__ = ["ProofChecker", "endorsement_problem", "refusal_problem", "sorted_ids",
           "tx_problem"]


def tx_problem(tx: Transaction, client_keys: Verifier) -> str | None:
    """Why `tx` must be dropped (malformed, unsigned, forged), or None."""
    if (not isinstance(tx.request_no, int) or tx.request_no < 0
            or not isinstance(tx.deadline_ms, int) or tx.deadline_ms < 0):
        return "malformed_tx"
    reqs = tx.requirements
    if not all(isinstance(r, Requirement) for r in reqs):
        return "malformed_tx"
    keys = [r.key for r in reqs]
    if keys != sorted(set(keys)):
        return "malformed_tx"
    if not tx.signature or not client_keys.verify(NodeId(tx.client), tx, tx.signature):
        return "bad_tx_signature"
    return None


def sorted_ids(ids: tuple[TxId, ...]) -> bool:
    return all(isinstance(t, bytes) for t in ids) and list(ids) == sorted(set(ids))


def refusal_problem(r: Refusal, nodes: tuple[NodeId, ...], crypto: Verifier) -> str | None:
    if r.endorser not in nodes:
        return "unknown_endorser"
    if not crypto.verify(r.endorser, r, r.signature):
        return "bad_refusal_signature"
    return None


class ProofChecker:
    """Verifies a `TransactionProof` that a transaction is applicable (a veto's proof):
    the client's signature and at least Q_policy endorsements of that transaction validly
    signed by distinct known nodes (the reference does not verify proofs: gap 4).

    Deterministic: every correct node judges a proof alike (nothing is checked against
    local state, such as whether a condition committed here), which the veto procedure's
    agreement needs; a proof whose endorsements are conditional still keeps (the safe side:
    keeping is not committing)."""

    __slots__ = ("_client_keys", "_crypto", "_nodes", "_quorum_for", "_roots", "_tx_id")

    def __init__(self, *, nodes: tuple[NodeId, ...], crypto: Verifier, client_keys: Verifier,
                 quorum_for: Callable[[str], int], tx_id: Callable[[Transaction], TxId],
                 roots: VerifiedRoots | None = None) -> None:
        self._roots = roots
        self._nodes = nodes
        self._crypto = crypto
        self._client_keys = client_keys
        self._quorum_for = quorum_for
        self._tx_id = tx_id

    def __call__(self, proof: TransactionProof) -> bool:
        tx = proof.tx
        if not isinstance(tx, Transaction) or tx_problem(tx, self._client_keys) is not None:
            return False
        tx_id = self._tx_id(tx)
        seen: set[NodeId] = set()
        for e in proof.endorsements:
            if (not isinstance(e, Endorsement) or e.tx_id != tx_id or e.endorser in seen
                    or endorsement_problem(e, self._nodes, self._crypto, self._roots) is not None):
                return False
            seen.add(e.endorser)
        return len(seen) >= self._quorum_for(tx.policy)
