"""The state every sub-machine of a PBFT replica reads, and the outbox of one step.

Owns: `Shared`: the replica's fixed parts (config, id, peers, crypto, the signer
`SafetyRules`, the `MessageLog`), where it stands (`view`, `active`, `executed`, the tick
count), the drop counters, the per-step outbox that `PbftCore` turns into a `Ready` (messages,
early messages, committed entries, a snapshot, rejections, own votes to count once durable,
the dirty flags), and the numbering of Readies (`ready_number`, `persisted`, `early_ready`).
It decides nothing: the sub-machines (`vote_flow`, `request_flow`, `view_flow`,
`checkpoint_flow`) change it, `core.py` creates it and empties the outbox at each step.

Must not import: trio, sockets, clocks, randomness, `phalanx.net`.

Invariants: `view` only grows (`view_flow` moves it); `executed` only grows (`vote_flow`
executes, `checkpoint_flow` installs a checkpoint); the outbox holds one step's output only.
"""

from __future__ import annotations

from phalanx.consensus.core import Rejection, Send, Snapshot
from phalanx.consensus.crypto import Crypto
from phalanx.consensus.pbft.config import PbftConfig
from phalanx.consensus.pbft.log import MessageLog
from phalanx.consensus.pbft.messages import Commit, Prepare, PrePrepare
from phalanx.consensus.pbft.safety import SafetyRules
from phalanx.consensus.types import Entry, Message, NodeId

Vote = PrePrepare | Prepare | Commit


class Shared:
    """See the module docstring."""

    __slots__ = (
        "active",
        "cfg",
        "crypto",
        "dropped",
        "durable_dirty",
        "early",
        "early_ready",
        "exec_out",
        "executed",
        "executed_ts",
        "hard_dirty",
        "log",
        "me",
        "new_own",
        "now_ms",
        "out",
        "peers",
        "persisted",
        "ready_number",
        "rejected_out",
        "safety",
        "snapshot_out",
        "ticks",
        "view",
    )

    def __init__(
        self,
        config: PbftConfig,
        *,
        crypto: Crypto,
        safety: SafetyRules,
        log: MessageLog,
        view: int,
        active: bool,
        executed: int,
    ) -> None:
        self.cfg = config
        self.me = config.node_id
        self.peers = config.peers()
        self.crypto = crypto
        self.safety = safety
        self.log = log
        self.view = view
        self.active = active
        self.executed = executed
        self.ticks = 0
        self.now_ms = 0  # the newest clock reading (`Tick.now_ms`; 0: none yet)
        self.executed_ts = 0  # the block stamp's timestamp of the last batch executed
        self.dropped: dict[str, int] = {}
        # Numbering of Readies: the last one returned, the last one `Persisted` reported,
        # and the one that made `early_view == view` durable (None: not yet, in this view).
        self.ready_number = 0
        self.persisted = 0
        self.early_ready: int | None = None
        # The outbox of the current step (emptied by `begin`).
        self.out: list[Send] = []
        self.early: list[Send] = []
        self.exec_out: list[Entry] = []
        self.snapshot_out: Snapshot | None = None
        self.rejected_out: list[Rejection] = []
        self.new_own: list[Vote] = []  # own votes recorded first: counted once durable
        self.durable_dirty = False  # `durable_state()` changed: persist it
        self.hard_dirty = False  # the view or the executed seq changed

    def begin(self) -> None:
        """Empty the outbox for a new step (a list the last step left empty is kept: most
        steps add nothing to most of them; `PbftCore._finish` copies what they hold)."""
        if self.out:
            self.out = []
        if self.early:
            self.early = []
        if self.exec_out:
            self.exec_out = []
        self.snapshot_out = None
        if self.rejected_out:
            self.rejected_out = []
        if self.new_own:
            self.new_own = []
        self.durable_dirty = False
        self.hard_dirty = False

    def is_primary(self) -> bool:
        return self.cfg.primary(self.view) == self.me

    def drop(self, reason: str) -> None:
        """Peer input dropped: count it by reason (`status().dropped`)."""
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def send(self, to: NodeId, message: Message) -> None:
        self.out.append(Send(to=to, message=message))

    def broadcast(self, message: Message) -> None:
        out = self.out
        for peer in self.peers:
            out.append(Send(to=peer, message=message))

    def send_early(self, vote: PrePrepare | Prepare) -> None:
        """Broadcast an own vote before any record of it is durable (see `early_ok`)."""
        self.early.extend(Send(to=peer, message=vote) for peer in self.peers)

    def early_ok(self, view: int) -> bool:
        """Whether our pre-prepare or prepare of `view` may go early: before any record of
        it is durable, counted at once (`SafetyRules`' module docstring argues why the
        restart fence makes that safe). Only once this view's `early_view` record is."""
        early = self.early_ready
        return (
            early is not None
            and early <= self.persisted
            and self.active
            and self.safety.early_view == self.view == view
        )
