"""The leaderless core's status record (`LeaderlessCore.status()`) and its inspection of
stuck transactions (`LeaderlessCore.stuck()`).

Owns: `LeaderlessStatus`, `StuckReport` (which old pending transactions wait, and on what:
`stuck_report`), which ignored inputs are benign (`BENIGN_DUPLICATES`) and the rejection
texts (`REASONS`). Pure data; building either never changes the core (deterministic:
insertion-ordered dicts and sorted tuples only).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from phalanx.consensus.core import CoreStatus
from phalanx.consensus.leaderless.messages import TxId
from phalanx.consensus.leaderless.store import TxRecord, TxState
from phalanx.consensus.leaderless.veto_votes import VetoCheckpoint
from phalanx.consensus.types import NodeId


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderlessStatus(CoreStatus):
    """`CoreStatus` of the leaderless core: role "endorser", term 0, no leader,
    `commit_index` = the last released local index.

    Attributes:
        pending: known undecided transactions.
        oldest_pending_ms: the earliest deadline (ms since the epoch) among them, 0 when
            none (the simulator's `quiescence` check: one stuck for good shows here).
        committed: transactions committed by this process (restored ones included).
        dropped_txs: transactions dropped (checkpoint or abort certificate).
        aborted: `Abort`s emitted.
        gated: committed transactions waiting at the version gate.
        skipped_reads: committed read-only transactions skipped at the gate, past their
            deadline (`ReleaseGate.skip_stale_reads`).
        gc_horizon_ms: the garbage-collection horizon.
        duplicate: benign re-sends ignored, by reason (`BENIGN_DUPLICATES`: peers'
            periodic re-sends, client retries); `dropped` keeps the suspicious input.
        installs: checkpoints installed by state transfer (`catch_up.py`).
        catching_up: why this node is asking peers for a checkpoint ("" when it is not).
        behind_checkpoints: verified checkpoints refused because they lacked a write
            applied here (a newer one is awaited).
    """

    pending: int = 0
    oldest_pending_ms: int = 0
    committed: int = 0
    dropped_txs: int = 0
    aborted: int = 0
    gated: int = 0
    skipped_reads: int = 0
    gc_horizon_ms: int = 0
    duplicate: Mapping[str, int] = field(default_factory=dict)
    installs: int = 0
    catching_up: str = ""
    behind_checkpoints: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitingCheckpoint:
    """An undecided checkpoint this node remembers: its id, its transaction ids and the
    voters whose vote is not delivered here yet (sorted; this node among them while it has
    not voted)."""

    checkpoint: bytes
    waiting_on: tuple[NodeId, ...]
    tx_ids: tuple[TxId, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class StuckTx:
    """One pending transaction whose deadline is at or before the report's cutoff.

    Attributes:
        tx_id, deadline_ms: the transaction.
        checkpoints: the undecided checkpoints here that name it (veto mode; empty in the
            ordered mode, whose decisions come from PBFT).
        conditions: the ids its held endorsements name as conditions that are not decided
            here (pending or unknown): it waits for their decision (sorted).
        past_horizon: its deadline is older than this node's GC horizon (held undecided
            past it; state transfer may decide it, `catch_up.py`).
    """

    tx_id: TxId
    deadline_ms: int
    checkpoints: tuple[WaitingCheckpoint, ...] = ()
    conditions: tuple[TxId, ...] = ()
    past_horizon: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class StuckReport:
    """`LeaderlessCore.stuck(before_ms)`: the pending transactions with a deadline at or
    before `before_ms` (in the store's order), the undecided checkpoints this node remembers
    (`undecided`, their ids too: a condition this node holds nothing of may wait in one) and
    those it has not voted in (`unvoted`: it abstains, veto rule 2, or has not voted yet),
    for the simulator's per-transaction `quiescence` scope."""

    txs: tuple[StuckTx, ...] = ()
    unvoted: tuple[bytes, ...] = ()
    undecided: tuple[WaitingCheckpoint, ...] = ()


def stuck_report(pending: Iterable[TxRecord], *, before_ms: int, horizon: int,
                 state_of: Callable[[TxId], TxState | None],
                 undecided: Mapping[bytes, VetoCheckpoint], voters: tuple[NodeId, ...],
                 node: NodeId) -> StuckReport:
    """Build the report (reads only): `undecided` are the veto machine's undecided
    checkpoints by id (empty in the ordered mode), `voters` the sorted members."""
    by_tx: dict[TxId, list[WaitingCheckpoint]] = {}
    unvoted: list[bytes] = []
    waits: list[WaitingCheckpoint] = []
    for cid, cp in undecided.items():
        if node not in cp.delivered and cp.own is None:
            unvoted.append(cid)
        waiting = WaitingCheckpoint(
            checkpoint=cid, waiting_on=tuple(v for v in voters if v not in cp.delivered),
            tx_ids=cp.tx_ids)
        waits.append(waiting)
        for t in cp.tx_ids:
            by_tx.setdefault(t, []).append(waiting)
    txs = []
    for record in pending:
        if record.deadline > before_ms:
            continue
        conditions = sorted({c for e in record.endorsements.values() for c in e.conditions
                             if state_of(c) in (None, TxState.PENDING)})
        txs.append(StuckTx(tx_id=record.tx_id, deadline_ms=record.deadline,
                           checkpoints=tuple(by_tx.get(record.tx_id, ())),
                           conditions=tuple(conditions), past_horizon=record.deadline < horizon))
    return StuckReport(txs=tuple(txs), unvoted=tuple(unvoted), undecided=tuple(waits))


BENIGN_DUPLICATES = frozenset({"duplicate_tx", "decided_tx", "duplicate_endorsement",
                               "decided_endorsement", "duplicate_submit", "duplicate_refusal"})
"""Ignored inputs that the protocol's own re-sends and client retries produce all the time:
counted in `status().duplicate`, not `dropped` (so a drop count means something)."""

REASONS = {
    "undecodable_submit": "the command is not a transaction",
    "submit_mismatch": "client_id, request_no or read_only differ from the transaction's",
    "submit_expired": "the transaction's deadline has passed",
    "malformed_tx": "malformed transaction (request number, deadline or requirements)",
    "client_overloaded": "this client has too many undecided transactions at this node "
                         "(max_pending_per_client): retry once some are decided",
    "bad_tx_signature": "the transaction's signature does not verify with the key this node "
                        "holds for its client (a client key missing from the nodes' keyring?)",
}

INVALID_SUBMITS = frozenset({"undecodable_submit", "submit_mismatch", "malformed_tx",
                             "bad_tx_signature"})
"""Rejections no correct node would answer otherwise: `Rejection.invalid` (the client gets
an error after f+1 matching answers instead of retrying until its deadline)."""
