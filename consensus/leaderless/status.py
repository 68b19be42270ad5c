"""The leaderless core's status record (`LeaderlessCore.status()`).

Owns: `LeaderlessStatus`. Pure data; building it never changes the core.
"""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.consensus.core import CoreStatus


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderlessStatus(CoreStatus):
    """`CoreStatus` of the leaderless core: role "endorser", term 0, no leader,
    `commit_index` = the last released local index.

    Attributes:
        pending: known undecided transactions.
        committed: transactions committed by this process (restored ones included).
        dropped_txs: transactions dropped (checkpoint or abort certificate).
        aborted: `Abort`s emitted.
        gated: committed transactions waiting at the version gate.
        gc_horizon_ms: the garbage-collection horizon.
    """

    pending: int = 0
    committed: int = 0
    dropped_txs: int = 0
    aborted: int = 0
    gated: int = 0
    gc_horizon_ms: int = 0
