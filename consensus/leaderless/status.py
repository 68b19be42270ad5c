"""The leaderless core's status record (`LeaderlessCore.status()`).

Owns: `LeaderlessStatus`. Pure data; building it never changes the core.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

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
        duplicate: benign re-sends ignored, by reason (`core.BENIGN_DUPLICATES`: peers'
            periodic re-sends, client retries); `dropped` keeps the suspicious input.
    """

    pending: int = 0
    committed: int = 0
    dropped_txs: int = 0
    aborted: int = 0
    gated: int = 0
    gc_horizon_ms: int = 0
    duplicate: Mapping[str, int] = field(default_factory=dict)
