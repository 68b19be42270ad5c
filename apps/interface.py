"""The application contract: what a replicated state machine offers the replica layer.

Owns: the `StateMachine` and `StateSnapshot` protocols, the optional `EndorsementHooks` the
leaderless core uses (key access sets, with `KeyUpdate`s and the application's commutativity
relation over them, and a local accept/reject vote), the optional
`Admission` hook a node runs on a request when it arrives (size limits, before anything is
proposed or replicated), the optional `BatchHooks` that show an application block boundaries
(`BatchInfo`), and the typed errors an application raises on malformed snapshot
data.

Must not import: anything from `phalanx.consensus` cores, `phalanx.storage`, trio, sockets or
clocks. Applications never see consensus (the ABCI rule, house style 7.1); they see opaque
command bytes in commit order.

Invariants every application must keep:
- `apply` and `query` are functions of (state, input bytes) only: no clocks, no randomness, no
  set-iteration order, no `id()`. Two replicas that apply the same commands hold equal state
  and return equal bytes.
- `apply` never raises on any input: a malformed or invalid command yields a typed error
  *result* (bytes), because peer and client input is normal input.
- `snapshot()` is O(1) and isolated: mutating the machine afterwards never changes what the
  snapshot serialises to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


class SnapshotFormatError(Exception):
    """Checkpoint bytes that do not parse as this application's (or the replica's) format.

    Raised by `restore`; checkpoint data may come from disk or from a peer, so it is input,
    never asserted on.
    """


class StateSnapshot(Protocol):
    """An immutable, O(1)-taken view of a state machine's state, serialised on demand."""

    def chunks(self) -> Iterator[bytes]:
        """Serialise the state as a sequence of byte chunks whose concatenation `restore`
        accepts.

        Each `next()` must do bounded work (well under a millisecond or two of CPU), so a
        checkpoint writer can interleave serialisation with applying new commands without
        stalling them. A step that produces no output yet (sorting, say) yields `b""`.

        Determinism: MUST be deterministic: equal states give equal concatenated bytes on
        every replica and in every process (so PBFT checkpoint digests agree). In particular,
        never rely on dict/set/hash-map iteration order: sort.
        """
        ...


class StatePiece(Protocol):
    """A piece of a snapshot's serialisation known by its SHA-256 before its bytes are made
    (same shape as `phalanx.storage.interface.Piece`)."""

    @property
    def digest(self) -> bytes:
        """SHA-256 of `data()`: equal on every replica for an equal piece."""
        ...

    def data(self) -> bytes: ...


@runtime_checkable
class PiecedSnapshot(Protocol):
    """Optional on a `StateSnapshot` whose serialisation falls into content-defined pieces
    (the KV store's shards): the replica layer checkpoints through `pieces`, and a
    content-addressed checkpoint store writes only the pieces it does not hold yet."""

    def pieces(self) -> Iterator[bytes | StatePiece]:
        """The `chunks` stream, with some chunks given as `StatePiece`s (their `data()` in
        their place); the concatenation is exactly that of `chunks`."""
        ...


class StateMachine(Protocol):
    """A deterministic application replicated by phalanx.

    Commands, query requests and results are opaque bytes here; each application defines and
    encodes its own typed commands (see `phalanx.apps.kv`).
    """

    def apply(self, command: bytes) -> bytes:
        """Execute one committed command and return its result.

        Determinism: MUST be deterministic (state and `command` only).
        Errors: MUST NOT raise on any input; malformed or invalid commands get a typed error
        result. An exception escaping `apply` is a bug in the application and stops the replica.
        """
        ...

    def query(self, request: bytes) -> bytes:
        """Answer a read-only request against the current state without changing it.

        Determinism: MUST be deterministic given the state (replicas at the same applied index
        give the same answer). Errors: like `apply`, never raises; a request that is not a
        read gets a typed error result.
        """
        ...

    def snapshot(self) -> StateSnapshot:
        """Take an O(1) snapshot of the current state (e.g. share a persistent map).

        Determinism: the snapshot's serialisation MUST be deterministic (see `StateSnapshot`).
        Isolation: later `apply` calls MUST NOT change the snapshot.
        """
        ...

    def restore(self, data: bytes) -> None:
        """Replace the whole state with the one serialised in `data`.

        Determinism: MUST be deterministic. Errors: raises `SnapshotFormatError` when `data`
        is malformed; the machine's state is then unchanged.
        """
        ...


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class KeyUpdate:
    """One write to `key` described precisely enough to decide whether it commutes with
    another (PnyxDB §1.3's operations): `op` names the operation in the application's own
    vocabulary (the KV app: ``set``, ``add``, ``mul``, ``sadd``, ``srem``, ``concat``) and
    `operand` is its argument, as bytes. Consensus never interprets either: it hands pairs of
    updates of the same key to the application's `EndorsementHooks.commutes`."""

    key: str
    op: str
    operand: bytes = b""


CommutesFn = Callable[[KeyUpdate, KeyUpdate], bool]
"""Whether two updates of the same key commute (`EndorsementHooks.commutes`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyAccess:
    """The keys a command may read and write, for conflict detection (PnyxDB §1.3).

    Tuples are sorted and unique so that equal accesses compare and encode equal.
    `read_prefixes` covers range reads (a scan reads every key starting with the prefix).
    `writes` lists every key the command may write. `updates` refines some of them: a key
    written only through updates (every write of it is described there, and the command
    does not read it otherwise) conflicts with another command's updates of that key only
    when some pair of them does not commute. A written key without updates conflicts with
    any other access to it, and so does any read of a key the other command writes.
    """

    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    read_prefixes: tuple[str, ...] = ()
    updates: tuple[KeyUpdate, ...] = ()

    def __post_init__(self) -> None:
        for name in ("reads", "writes", "read_prefixes", "updates"):
            value: tuple[str, ...] | tuple[KeyUpdate, ...] = getattr(self, name)
            # (0 or 1 items are sorted and unique: the usual single-key command skips the
            # sort; this ran once per transaction and node, ~3% of a leaderless node's CPU)
            if len(value) > 1 and list(value) != sorted(set(value)):  # type: ignore[type-var]
                raise ValueError(f"KeyAccess.{name} must be sorted and unique: {value!r}")
        updates = self.updates
        if updates and not (
                (len(updates) == 1 and updates[0].key in self.writes)
                or {u.key for u in updates} <= set(self.writes)):
            raise ValueError("KeyAccess.updates name keys missing from writes")

    def conflicts_with(self, other: KeyAccess, commutes: CommutesFn | None = None) -> bool:
        """True when one command writes something the other reads or writes, unless (given
        `commutes`) every such key is one both only update, through updates that commute
        pairwise. Without `commutes`, every write conflicts (no update commutes)."""
        for mine, theirs in ((self, other), (other, self)):
            touched = set(theirs.reads) | set(theirs.writes)
            for key in mine.writes:
                hit = key in touched or any(key.startswith(p) for p in theirs.read_prefixes)
                if hit and (commutes is None or not _commuting_key(key, mine, theirs, commutes)):
                    return True
        return False


def _commuting_key(key: str, a: KeyAccess, b: KeyAccess, commutes: CommutesFn) -> bool:
    """Whether `a` and `b` touch `key` only through updates that commute pairwise."""
    if key in a.reads or key in b.reads or any(
            key.startswith(p) for p in (*a.read_prefixes, *b.read_prefixes)):
        return False
    ua = [u for u in a.updates if u.key == key]
    ub = [u for u in b.updates if u.key == key]
    if not ua or not ub:
        return False
    return all(commutes(x, y) for x in ua for y in ub)


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """A replica's local accept/reject vote on a command (PnyxDB's application-level vote)."""

    accept: bool
    reason: str = ""


@runtime_checkable
class Housekeeping(Protocol):
    """An optional hook for a state machine that defers work (freeing replaced structures,
    adopting a layout its last checkpoint built) to keep `apply` short."""

    def maintain(self) -> None:
        """Do one bounded piece of deferred work (about a millisecond at most).

        The runtime calls it (through `Replica.maintain`) on every tick with no persistence
        in flight, so an idle replica still finishes its housekeeping; the simulator does
        not. Determinism: MUST NOT change what any query or command returns.
        """
        ...


@runtime_checkable
class TransactionAware(Protocol):
    """An optional hook for a state machine in transaction mode (`Replica(transactions=...)`,
    the leaderless core): the replica calls `apply_tx` instead of `apply` for every
    transaction it runs, so the machine can key per-key versions on transaction ids (the
    KV app's base and full versions, `phalanx.apps.kv_versions`). Outside transaction mode
    only `apply` is called."""

    def apply_tx(self, tx_id: bytes, command: bytes, pinned: Sequence[str] = ()) -> bytes:
        """`apply(command)` as transaction `tx_id` (unique: the replica runs each id once).
        `pinned`: the keys the transaction requires by FULL version (not only by base): a
        commuting update of one of them is ordered like any other write (the KV app moves
        its base), else a later update endorsed only against the base could apply before
        it on a lagging replica, where its full requirement would then never hold
        (docs/LEADERLESS.md "Simulation").

        Determinism: as `apply`, given the same `tx_id` and `pinned`."""
        ...


@runtime_checkable
class EndorsementHooks(Protocol):
    """Optional hooks for the leaderless (endorsement) core; consensus never reads app state
    except through them."""

    def access(self, command: bytes) -> KeyAccess:
        """The keys `command` reads and writes.

        Determinism: MUST be deterministic and depend on `command` only (not on state), so
        every replica computes the same conflicts. Never raises: a malformed command touches
        no keys (and `check` rejects it).
        """
        ...

    def check(self, command: bytes) -> Verdict:
        """Whether this replica is willing to endorse `command` in its current state.

        Determinism: need NOT be deterministic across replicas (it is a local policy vote,
        e.g. a validity check against local state); it MUST NOT change state or raise.
        """
        ...

    def commutes(self, a: KeyUpdate, b: KeyUpdate) -> bool:
        """Whether updates `a` and `b` of the same key give the same state and the same
        results in either order (pass it to `KeyAccess.conflicts_with`).

        Determinism: MUST be a pure function of the two updates, symmetric, and never raise
        (an update it does not know conflicts).
        """
        ...

    def versions(self, keys: Sequence[str]) -> tuple[bytes, ...]:
        """The current version of each of `keys`, in order (PnyxDB's per-key versions):
        ``b""`` for an absent key, else an application-defined digest of its value (the KV
        app: `phalanx.apps.kv_ops.version_of`). A transaction's requirements name versions
        in this form.

        Determinism: MUST be a function of the state (equal values, equal versions, on every
        replica); MUST NOT change state or raise.
        """
        ...

    def needs_requirements(self, command: bytes) -> tuple[str, ...]:
        """The keys (sorted, unique) on which a transaction running `command` must carry a
        requirement: every key it reads, and every key it writes other than through updates
        that reach the same state in any order (the KV app: add, mul, sadd, srem need none;
        set, delete, concat, cas and txn writes do). Without one, a blind overwrite could
        apply in different orders on different replicas; the leaderless core never endorses
        such a transaction. Range reads (`KeyAccess.read_prefixes`) cannot carry
        requirements and are not listed.

        Determinism: MUST depend on `command` only; never raises (a malformed command needs
        none: `check` refuses it).
        """
        ...


@runtime_checkable
class BaseVersions(Protocol):
    """Optional `EndorsementHooks` for apps whose commuting updates carry requirements on a
    BASE version (docs/LEADERLESS.md "Mixing update kinds on one key"; the KV app:
    `phalanx.apps.kv_versions`). Without them a commuting update carries no requirement
    and mixing it with overwrites of the same key can diverge."""

    def base_versions(self, keys: Sequence[str]) -> tuple[bytes, ...]:
        """Each key's base version: unchanged by the commuting updates that fit its current
        run, changed to a value it never had before by every other write. MUST NOT change
        state or raise."""
        ...

    def needs_base(self, command: bytes) -> tuple[str, ...]:
        """The keys `command` writes only by commuting updates (sorted): a transaction
        carries a requirement (base or full) on each. Pure."""
        ...

    def fits_run(self, command: bytes, keys: Sequence[str]) -> bool:
        """Whether `command`'s commuting updates of `keys` commute with every update applied
        on those keys' current bases: a transaction requiring only their base versions may
        be endorsed only then (else it needs the full version). A local vote on the
        applied state, like `EndorsementHooks.check`; never raises."""
        ...


@runtime_checkable
class Admission(Protocol):
    """Optional arrival checks: what a node refuses before a request is proposed.

    The runtime driver calls `admit` on every client request it receives (writes and
    linearizable reads) before the core sees it, and answers a refusal with
    `ReplyStatus.ERROR` and the returned message: an oversized key or value never reaches
    the log, the peers or the WAL. `apply` must still refuse the same commands (a second
    line: a Byzantine primary, or a node without the hook, may order them anyway).

    `max_command_bytes` bounds every command `admit` accepts; the client port derives its
    frame limit from it (plus the request envelope), so a client cannot make a node buffer
    more than the largest legal request.
    """

    max_command_bytes: int

    def admit(self, command: bytes, read_only: bool) -> str | None:
        """None when `command` may be proposed; else a one-line reason for the client.

        Determinism: need not be deterministic across replicas (it only filters what this
        node proposes); MUST NOT change state or raise on any input. Keep it cheap: it runs
        on the node's core task for every request.
        """
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchInfo:
    """What consensus tells an application about one batch of committed commands (a block).

    `index` is the batch's position in the consensus order (Raft's log index of its first
    entry, PBFT's sequence number): strictly increasing across batches, not necessarily
    contiguous. `timestamp` (milliseconds) and `proposer` (a node id) are the values the
    batch was ordered with (the leader's or primary's, agreed by consensus: the entry's block
    stamp, see `wants_block_stamp`), identical on every replica: the only clock an
    application may read. 0 and "" when the core gave the entry no stamp (the proposer may
    then come from the protocol's `proposer_of` rule).
    """

    index: int
    timestamp: int
    proposer: str


@runtime_checkable
class BatchHooks(Protocol):
    """Optional block boundaries: the replica calls `begin_batch(info)`, then `apply` for each
    command of the batch in order, then `end_batch()`. An application that commits to its
    state per block (the chain app's state root) batches its work there.

    A replica that does not know the hooks only calls `apply`; an application implementing
    them MUST still work then (the chain app treats each such command as its own block).
    Snapshots may be taken between any two calls, including inside a batch; `restore` then
    resumes inside it.
    """

    def begin_batch(self, info: BatchInfo) -> None:
        """Open a batch. Determinism: a function of the state and `info` only. Raises
        RuntimeError when a batch is already open (the replica's own misuse)."""
        ...

    def end_batch(self) -> bytes:
        """Close the open batch and return the application's commitment to its state after
        it (the chain app: the block's state root). Determinism: MUST be deterministic.
        Raises RuntimeError when no batch is open."""
        ...


@runtime_checkable
class CheckpointDigest(Protocol):
    """Optional: the application's own digest of its state, for checkpoint votes (PBFT) in place
    of a hash of the whole serialised state (`phalanx.apps.checkpoint_digest` combines it
    with the replica's session table). Both methods MUST give the same bytes for the same
    state, and any two states that `restore` would load differently MUST get different
    digests (a peer's checkpoint is trusted by its digest alone)."""

    def state_digest(self) -> bytes:
        """The digest of the current state; cheap (the chain: its header fields, the open
        block's dirty accounts and a running hash of its blocks; the state root stands for
        the accounts). Called when a checkpoint is taken, between batches."""
        ...

    def snapshot_digest(self, data: bytes) -> bytes:
        """The same digest, of the checkpoint bytes `data` (what `snapshot().chunks()`
        produced), after checking them as strictly as `restore` (state transfer trusts the
        result). Raises `SnapshotFormatError` on bad data; never changes the machine."""
        ...


def wants_block_stamp(machine: object) -> bool:
    """Whether `machine` asks consensus for block stamps (each batch's `BatchInfo.timestamp`
    and `proposer` agreed with the batch, `Entry.timestamp`/`proposer`): it has `BatchHooks`.
    A node turns the stamps on only then, so other apps' entries and messages are unchanged."""
    return isinstance(machine, BatchHooks)


BlockListener = Callable[[int, bytes], None]
"""Called with (height, block hash) after the application closed a block."""


@runtime_checkable
class BlockStream(Protocol):
    """Optional: an application that builds hash-linked blocks (the chain app) lets node-local
    observers see each block it closes, e.g. the block-certifier node service
    (`phalanx.services.block_certifier`), which signs (`block_id`, height, block hash).

    Listeners are NOT replicated state: they are called synchronously from `end_batch` (also
    when the runtime re-applies entries after a restart; a checkpoint restore calls none),
    after the block is final; they must not raise or call back into the machine. Results,
    blocks and roots never depend on them.
    """

    @property
    def block_id(self) -> bytes:
        """32 bytes naming the chain every block belongs to (the chain app: its chain id)."""
        ...

    @property
    def height(self) -> int:
        """The newest block's height (also after a checkpoint restore or a state transfer,
        which call no listener)."""
        ...

    def block_hash_at(self, height: int) -> bytes | None:
        """The hash of this node's block at `height`, None when it holds none (what a
        certificate fetched from a peer is checked against)."""
        ...

    def on_block(self, listener: BlockListener) -> None:
        """Call `listener(height, block_hash)` for every block closed from now on."""
        ...
