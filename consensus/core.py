"""The contract between every consensus core and the code that drives it.

A core (Raft, PBFT, the leaderless endorsement core) is a pure, deterministic state machine:

    ready = core.step(input)

Inputs are the only way anything reaches a core: a peer's message (`Receive`), the passage of
time (`Tick`), a client request (`Submit`), the completion of local persistence
(`Persisted`), and a checkpoint the replica layer took or installed (`CheckpointTaken`,
`CheckpointInstalled`). Cores may accept further, core-specific inputs (Raft's membership
changes, for example) declared in their own package.

The single output of a step is a `Ready` bundle. Its docstring states the ordering rule that
every driver (the trio runtime, the deterministic simulator, the data-driven test harness)
must follow.

Rules of this module and of every core:
- No trio, sockets, files, clocks or global randomness. Time is a count of `Tick`s; a core
  that needs randomness or crypto receives it at construction.
- Determinism: the same construction arguments and the same input sequence give the same
  outputs, byte for byte. No behaviour may depend on set iteration order or on `id()`.
- A faulty peer's input is dropped and counted in `status()`; it never raises. Misuse by the
  caller raises `LocalProtocolError`.

Plain declarations: the hot records (`CORE_HOT_RECORDS`) get the cheaper ``__init__`` of the
private `phalanx.consensus._raw_init` at the end of this module; hot paths build them through
`phalanx.consensus._fastpath` (cheaper constructors of the same objects).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias

from phalanx.consensus._raw_init import raw_init
from phalanx.consensus.types import (
    ClientRequest,
    Entry,
    HardState,
    Message,
    NodeId,
    SnapshotMeta,
)


class SnapshotData(Protocol):
    """The read-only bytes of a durable checkpoint, as a core keeps them to send to peers.

    `bytes` is one (the simulator and tests). The runtime passes a view that reads the
    checkpoint file on demand (`phalanx.storage.directory.FileRange`), so a core that keeps
    its newest checkpoint for lagging peers does not hold a second copy of the whole state in
    memory. Slicing returns `bytes`; a view may raise `OSError` if the disk fails, which a
    driver treats as fatal (fail-stop), like any other storage error.
    """

    def __len__(self) -> int: ...

    def __getitem__(self, key: slice, /) -> bytes: ...


def snapshot_bytes(data: SnapshotData) -> bytes:
    """All of `data` as `bytes` (no copy when it already is `bytes`)."""
    return data if isinstance(data, bytes) else data[:]


# --------------------------------------------------------------------------------------------
# Inputs


@dataclass(frozen=True, slots=True, kw_only=True)
class Receive:
    """A message from peer `src`, as authenticated by the transport. May be Byzantine."""

    src: NodeId
    message: Message


@dataclass(frozen=True, slots=True, kw_only=True)
class Tick:
    """One logical clock tick. Timeouts are counted in ticks (`election_ticks`, ...).

    `now_ms` is a wall-clock reading (milliseconds since the Unix epoch) for protocols whose
    inputs carry absolute deadlines (the leaderless core's transactions): the runtime fills
    it from the system clock, the simulator from its virtual clock (a fixed epoch plus
    virtual time, skewed per node like its tick rate). Cores that count ticks ignore it; a
    core that needs it treats None as "no reading yet" and decides nothing by it. Readings
    may go backwards (NTP steps): a core must stay safe when they do.
    """

    now_ms: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Submit:
    """A client request arriving at this replica."""

    request: ClientRequest


@dataclass(frozen=True, slots=True, kw_only=True)
class Persisted:
    """Every `Ready` numbered up to and including `number` is durable.

    A core never counts its own log entries or votes towards a quorum before it has been told
    they are durable.
    """

    number: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointTaken:
    """The replica layer made a checkpoint of the state after applying `index` durable.

    `data` is the serialised checkpoint (shared, not copied; in the runtime a view of the
    checkpoint file, see `SnapshotData`); a core may keep it to send to a lagging peer (Raft
    InstallSnapshot, PBFT state transfer) and may discard its log up to `index`.

    `digest`: the checkpoint's digest when the app supplies its own
    (`phalanx.apps.interface.CheckpointDigest`: e.g. the chain's state root and head block,
    computed without hashing the serialised state); None: a core that needs one hashes
    `data` (PBFT's checkpoint votes).
    """

    index: int
    data: SnapshotData
    digest: bytes | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointInstalled:
    """The replica layer restored a checkpoint obtained from peers (state transfer)."""

    meta: SnapshotMeta
    data: bytes


Input: TypeAlias = Receive | Tick | Submit | Persisted | CheckpointTaken | CheckpointInstalled

# --------------------------------------------------------------------------------------------
# Effects


@dataclass(frozen=True, slots=True, kw_only=True)
class Send:
    """Send `message` to peer `to`."""

    to: NodeId
    message: Message


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadState:
    """A read-only request whose linearization point is log index `index`.

    The driver answers it by querying the state machine once applied index >= `index`.
    """

    request: ClientRequest
    index: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejection:
    """A client request this replica will not handle; the client should retry elsewhere.

    `leader_hint` names the replica the client should try, when known. A rejected request was
    certainly not appended to the log by this replica. `invalid`: the request itself can
    never be accepted by a correct replica (malformed, or its client signature does not
    verify): the runtime answers it as an error, not "retry".
    """

    request: ClientRequest
    reason: str
    leader_hint: NodeId | None = None
    invalid: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Abort:
    """A definite outcome: `request` will never be applied by any correct replica.

    Unlike `Rejection` (not appended here; may succeed elsewhere), an abort is final: the
    protocol agreed it can no longer commit (the leaderless core: dropped by a checkpoint,
    or refused past its deadline by enough replicas that it can never gather a quorum). A
    client that receives f+1 matching aborts records the operation as failed. `reason` is
    one line for the client.
    """

    request: ClientRequest
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """A complete checkpoint: received from a peer (to install in place of the log prefix),
    or a core's own newest one (kept to send). Received ones are always `bytes`."""

    meta: SnapshotMeta
    data: SnapshotData


@dataclass(frozen=True, slots=True, kw_only=True)
class Ready:
    """Everything one `step` asks the driver to do, in the order the driver must do it.

    Ordering (the whole contract):
        0. `early_messages` may be sent at any point, even before step 1 (see the field).
        1. **Persist first.** If `snapshot` is set, install it (restore the state machine,
           store the checkpoint, reset the log after it). Then drop every log entry with index
           >= `truncate_from` (when set), append `entries`, and write `hard_state` and
           `core_state` (when set) atomically. If `must_sync`, make all of it durable
           (fsync) before step 2.
        2. **Then send** `messages`. A message may depend on state from step 1 (a vote, an
           appended entry); sending it before that state is durable breaks safety.
        3. **Apply in order.** Apply `committed` entries to the state machine strictly in
           index order, each exactly once, and answer the clients whose requests they carry.
        4. **Answer** `rejected` requests now, `aborted` ones now (a definite failure; see
           `Abort`), and `reads` once the applied index reaches `ReadState.index`.
        5. If this Ready had persistence work (`has_persistence`), feed `Persisted(number)`
           back to the core once step 1 is durable. Drivers that batch (group commit) may
           persist several Readys with one fsync and report the last number; messages of all
           of them are released only after that fsync.

    Readys are handled strictly in the order `step` returned them.

    Attributes:
        number: increases by one for every Ready that has persistence work; 0 otherwise.
        core_state: a core-specific durable record (a frozen dataclass registered with the
            codec, e.g. PBFT's `PbftDurableState`) that replaces the previously written one;
            the driver hands the last one back to the core on restart.
    """

    number: int = 0
    early_messages: tuple[Send, ...] = ()
    """Messages that depend on no state that is not yet durable (a leader's AppendEntries
    and heartbeats: its term was made durable before it campaigned, and it counts its own
    entries only after `Persisted`, Raft §10.2.1). The driver may send them at once, before
    persisting this Ready or any earlier one. Cores put a message here only when that holds."""
    snapshot: Snapshot | None = None
    truncate_from: int | None = None
    entries: tuple[Entry, ...] = ()
    hard_state: HardState | None = None
    must_sync: bool = False
    messages: tuple[Send, ...] = ()
    committed: tuple[Entry, ...] = ()
    reads: tuple[ReadState, ...] = ()
    rejected: tuple[Rejection, ...] = ()
    core_state: object | None = None
    aborted: tuple[Abort, ...] = ()

    @property
    def has_persistence(self) -> bool:
        return (
            self.snapshot is not None
            or self.truncate_from is not None
            or bool(self.entries)
            or self.hard_state is not None
            or self.core_state is not None
        )

    @property
    def is_empty(self) -> bool:
        return not (
            self.has_persistence
            or self.early_messages
            or self.messages
            or self.committed
            or self.reads
            or self.rejected
            or self.aborted
        )


EMPTY_READY = Ready()


# --------------------------------------------------------------------------------------------
# Status and the Core protocol


@dataclass(frozen=True, slots=True, kw_only=True)
class CoreStatus:
    """A read-only summary of a core, for operators, tests and invariant checkers.

    Cores return a subclass with protocol-specific fields. `dropped` counts peer messages the
    core discarded, by reason (stale term, bad signature, ...): Byzantine input is counted,
    never raised.
    """

    node: NodeId
    role: str
    term: int
    commit_index: int
    leader: NodeId | None
    dropped: Mapping[str, int] = field(default_factory=dict)
    recovering: bool = False
    """This node lost durable state (an empty or unreadable data directory: amnesia) and
    neither votes nor campaigns until it has caught up from a leader; the driver records
    the end of recovery durably once this turns False."""


class Core(Protocol):
    """What every consensus core offers its driver."""

    @property
    def node_id(self) -> NodeId: ...

    def step(self, inp: Input, /) -> Ready:
        """Feed one input; return what the driver must do (see `Ready` for the order)."""
        ...

    def status(self) -> CoreStatus:
        """A snapshot of the core's state; never changes the core."""
        ...


CORE_HOT_RECORDS: tuple[type, ...] = (Receive, Submit, Persisted, Send, ReadState, Rejection,
                                      Ready)
"""This module's records built once or more per message: `raw_init` gives each its cheaper
``__init__`` here, once (`phalanx.consensus._fastpath.HOT_RECORDS`)."""

for _cls in CORE_HOT_RECORDS:
    raw_init(_cls)
