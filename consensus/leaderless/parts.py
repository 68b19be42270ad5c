"""What the core's parts share: the per-step `Outbox`, and `CoreParts`, the declarations of
the state and methods `LeaderlessCore` (core.py) owns that its parts (`intake.PeerIntake`,
`ticks.TickWork`) use.

Owns no state: `CoreParts` only declares, for the type checker, what `LeaderlessCore`
builds in its constructor and defines; each part is a mixin of `LeaderlessCore` and runs on
the core's own state (split out to keep core.py small, not a sub-machine of its own).

Must not import: trio, sockets, clocks, global random, `phalanx.net`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from phalanx.consensus.core import Abort, Rejection, Send, Snapshot
from phalanx.consensus.types import Entry

if TYPE_CHECKING:
    from phalanx.consensus.crypto import Crypto
    from phalanx.consensus.leaderless.app_view import AppView
    from phalanx.consensus.leaderless.config import LeaderlessConfig
    from phalanx.consensus.leaderless.endorsement_batch import VerifiedRoots
    from phalanx.consensus.leaderless.fence import Fence
    from phalanx.consensus.leaderless.memory import Memory
    from phalanx.consensus.leaderless.messages import (
        Endorsement,
        Transaction,
        TransactionProof,
        TxId,
    )
    from phalanx.consensus.leaderless.ordered_veto import OrderedCheckpoints
    from phalanx.consensus.leaderless.recovery import Recovery
    from phalanx.consensus.leaderless.refetch import OverdueFetch
    from phalanx.consensus.leaderless.refusals import RefusalTally
    from phalanx.consensus.leaderless.release import Committed, ReleaseGate
    from phalanx.consensus.leaderless.rules import Rules
    from phalanx.consensus.leaderless.safety import SafetyKernel
    from phalanx.consensus.leaderless.schedule import DueHeap
    from phalanx.consensus.leaderless.store import TxRecord, TxStore
    from phalanx.consensus.leaderless.tx_codec import TxCodec
    from phalanx.consensus.leaderless.veto import CheckpointMachine
    from phalanx.consensus.types import Message


@dataclass(slots=True)
class Outbox:
    """What one step produces (turned into its `Ready` by `LeaderlessCore._ready`)."""

    sends: list[Send] = field(default_factory=list)
    signed: bool = False
    dirty: bool = False
    entries: list[Entry] = field(default_factory=list)
    replayed: list[Entry] = field(default_factory=list)
    aborted: list[Abort] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    snapshot: Snapshot | None = None
    """A verified checkpoint to install (state transfer, `catch_up.py`)."""


class CoreParts:
    """Declarations only (see the module docstring)."""

    if TYPE_CHECKING:
        _config: LeaderlessConfig
        _crypto: Crypto
        _app: AppView
        _store: TxStore
        _rules: Rules
        _gate: ReleaseGate
        _tally: RefusalTally
        _kernel: SafetyKernel
        _roots: VerifiedRoots
        _recovery: Recovery
        _refetch: OverdueFetch
        _checkpoints: CheckpointMachine | OrderedCheckpoints
        _fence: Fence
        _memory: Memory
        _queued: dict[TxId, None]
        _ticks: int
        _now: int | None
        _deadlines: DueHeap
        _wakeups: DueHeap
        _resends: DueHeap
        _resend_every: dict[TxId, int]
        _sync_numbers: list[int]
        _synced_ready: int
        _expired: dict[TxId, None]
        _to_refuse: dict[TxId, None]
        _waiting: dict[TxId, None]
        _wake: bool
        _seen_applied: int
        _fenced: bool
        _bugs: frozenset[str]
        _codec: TxCodec
        _replay: list[Entry]
        _restart: list[Committed]

        def _tx_id(self, tx: Transaction) -> TxId: ...
        def _drop(self, reason: str) -> None: ...
        def _broadcast(self, message: Message, out: Outbox) -> None: ...
        def _accept_tx(self, tx_id: TxId, tx: Transaction, out: Outbox) -> str | None: ...
        def _try_endorse(self, record: TxRecord, out: Outbox) -> None: ...
        def _retained_suffix(self, tx_id: TxId) -> bool: ...
        def _try_commit(self, record: TxRecord, out: Outbox) -> None: ...
        def _commit(self, record: TxRecord, endorsements: tuple[Endorsement, ...],
                    out: Outbox) -> None: ...
        def _drop_tx(self, record: TxRecord, reason: str, out: Outbox) -> None: ...
        def _proof_of(self, tx_id: TxId) -> TransactionProof | None: ...
        def _check_certificate(self, record: TxRecord, out: Outbox) -> None: ...
        def _resend_later(self, tx_id: TxId) -> None: ...
        def _seal(self, out: Outbox) -> None: ...
        def _stale_certified(self, proof: TransactionProof) -> None: ...
        def _new_record(self, tx_id: TxId, tx: Transaction) -> TxRecord: ...
        def _committed_item(self, record: TxRecord, proof: TransactionProof) -> Committed: ...
