"""Leaderless conditional-endorsement messages and durable records, after PnyxDB
(Bonniot, Neumann, Taïani, SRDS 2020; reference notes: protocols.md §1).

Owns: the wire types of the leaderless core (`Transaction`, `Endorsement`,
`StartCheckpoint`, `VetoChoice`, `Refusal`, `FetchTransactions`, `TransactionProof`,
`CommittedDigest`, the reliable broadcast of votes `VoteEchoDigest` and `VoteReady` (their
per-peer batch `VoteDigestBatch`, the body fetch `FetchVote`/`VoteBody`; the older
full-vote `VoteEcho` and its batch `VoteBatch`, still accepted), the batch
endorsement `EndorsementBatch` with `EndorsedTx` and the signed `EndorsementRoot`),
the durable record `LeaderlessDurableState`, and the stable codec ids `LEADERLESS_MESSAGES`
(300-399, see `phalanx.net.wire`).

Must not import: `phalanx.net` (the codec registers these classes, not the reverse), trio,
clocks, random.

Who signs what:
- A `Transaction` is signed by its CLIENT (a key of the cluster's client keyring, named by
  `Transaction.client`); nodes never sign transactions. Its id (`tx_id`) is the digest of
  its canonical encoding with the signature emptied, so a forged body has another id and a
  replay has the same id (deduplicated).
- `Endorsement`, `Refusal` and `VetoChoice` are signed by the node that issues them: they
  travel as proofs (a commit certificate is a transaction plus Q endorsements; an abort
  certificate a transaction plus enough refusals; a veto carries the proof that a
  transaction is applicable).
- `StartCheckpoint`, `FetchTransactions` and `CommittedDigest` are unsigned requests:
  acting on them never needs trust in the sender.
- `VoteEchoDigest`, `VoteReady`, `VoteDigestBatch`, `FetchVote` and `VoteBody` (Bracha's
  reliable broadcast of votes, `reliable_broadcast.py`; and the older `VoteEcho`,
  `VoteBatch`) are unsigned: they count as the sender's, which the transport authenticates
  (`Receive.src`); the vote inside a body or a full echo is the voter's signed `VetoChoice`,
  and it counts only when it hashes to the digest asked for.

Invariants: every class is a frozen, slotted, keyword-only dataclass whose fields are ints,
strs, bytes, bools, tuples or nested such dataclasses; tuples that are sets are sorted and
unique (so equal values encode equal).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

from phalanx.consensus.leaderless.transfer_messages import TRANSFER_MESSAGES
from phalanx.consensus.pbft.messages import PBFT_MESSAGES, PbftDurableState
from phalanx.consensus.types import ClientRequest, Message, NodeId

TxId = bytes
"""A transaction's id: the digest of its body (`Transaction` with the signature emptied)."""


_OPTIONAL = {"wire_optional": True}  # a trailing field old encodings omit (net/codec.py)

@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class Requirement:
    """The transaction commits only where `key`'s version is `version` (PnyxDB's "checks on
    versions"); an empty `version` means the key must not exist.

    `base` names the key's BASE version instead (`AppView.base_versions`: it changes on
    every write except the commuting updates): what a commuting update requires, so it is
    ordered after every non-commuting write its endorsers had applied, yet commutes with
    the other updates of its run (docs/LEADERLESS.md "Mixing update kinds on one key")."""

    key: str
    version: bytes
    base: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Transaction(Message):
    """A client's signed transaction (PnyxDB's Query).

    Attributes:
        client: the name of the client's signing key in the cluster's keyring.
        client_id: the client session the replies go to (as `ClientRequest.client_id`).
        request_no: the session's request number (a retry resends this exact transaction).
        deadline_ms: absolute wall-clock deadline (ms since the Unix epoch): no correct node
            endorses it afterwards.
        requirements: sorted by key, unique keys.
        command: the application's command (opaque; the app reads its keys through
            `phalanx.apps.interface.EndorsementHooks`).
        policy: the application policy it names ("" is the default policy).
        read_only: a linearizable read: it commits like a transaction (its requirements
            checked by Q nodes) and is answered by a query instead of applied.
        signature: the client's signature over the transaction with this field emptied.
    """

    client: str
    client_id: str
    request_no: int
    deadline_ms: int
    requirements: tuple[Requirement, ...]
    command: bytes
    policy: str = ""
    read_only: bool = False
    signature: bytes = b""

    def __str__(self) -> str:
        return (f"Transaction {self.client_id}/{self.request_no} deadline={self.deadline_ms} "
                f"|reqs|={len(self.requirements)}")


def transaction_id(tx: Transaction, encode: Callable[[Transaction], bytes]) -> TxId:
    """`tx`'s id: SHA-256 of its canonical wire encoding (`encode`, the codec's) with the
    signature emptied. The core and the replica layer's transaction table use this one
    definition, so they agree on identity."""
    body = dataclasses.replace(tx, signature=b"") if tx.signature else tx
    return hashlib.sha256(encode(body)).digest()


@dataclass(frozen=True, slots=True, kw_only=True)
class Endorsement(Message):
    """Node `endorser` endorses transaction `tx_id`, counting only while none of
    `conditions` (sorted tx ids) commits; unconditional when `conditions` is empty.

    Batch-signed (`endorsement_batch.py`): `signature` is the endorser's signature over
    `EndorsementRoot(endorser, root)`, where root is the Merkle root reached from this
    endorsement's leaf (`tx_id`, `conditions`) at position `index` through the sibling
    hashes `path` (empty path: a batch of one, root = leaf). Self-certifying alone."""

    tx_id: TxId
    endorser: NodeId
    conditions: tuple[TxId, ...] = ()
    signature: bytes = b""
    index: int = 0
    path: tuple[bytes, ...] = ()

    def __str__(self) -> str:
        return f"Endorsement {self.tx_id[:2].hex()} by {self.endorser} |C|={len(self.conditions)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class EndorsementRoot(Message):
    """What a node signs for a batch of its endorsements: the Merkle root of their leaves
    (`endorsement_batch.py`). Never sent on its own."""

    endorser: NodeId
    root: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class EndorsedTx(Message):
    """One item of an `EndorsementBatch`: a transaction id and the endorsement's conditions
    (sorted tx ids)."""

    tx_id: TxId
    conditions: tuple[TxId, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class EndorsementBatch(Message):
    """Every endorsement `endorser` signed in one step, under ONE signature (over the
    `EndorsementRoot` of `items`, in this order): the receiver verifies the batch once and
    holds each item as an `Endorsement` with its Merkle path (`endorsement_batch.expand`)."""

    endorser: NodeId
    items: tuple[EndorsedTx, ...]
    signature: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal(Message):
    """Node `endorser` has not endorsed `tx_id` and, its deadline having passed on the
    node's clock, never will. n-Q+1+f of them from distinct nodes prove the transaction can
    never gather Q endorsements (an abort certificate)."""

    tx_id: TxId
    endorser: NodeId
    signature: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class TransactionProof(Message):
    """A transaction with endorsements (or refusals) of it: a commit certificate when Q
    endorsements count, the applicability proof a veto carries, an abort certificate when
    `refusals` suffice. Self-certifying: every part is signed."""

    tx: Transaction
    endorsements: tuple[Endorsement, ...] = ()
    refusals: tuple[Refusal, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SignatureResend(Message):
    """A node's own signatures sent again in one message per peer per period (loss
    recovery, `ticks.TickWork._rebroadcast`): its endorsements of transactions it committed
    since the last period or still pending, its refusals of pending ones. Each item is
    self-certifying and handled as if it came alone (one message each, before: ~3
    per transaction and node)."""

    endorsements: tuple[Endorsement, ...] = ()
    refusals: tuple[Refusal, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class StartCheckpoint(Message):
    """Propose dropping the stuck transactions `tx_ids` (sorted, unique; PnyxDB §1.8). Sent
    again every period while the checkpoint is undecided at the sender: the receiver then
    answers with its reliable-broadcast messages of the votes whose voters are not in
    `delivered` (sorted: the votes the sender already delivered; an unsigned hint).
    `txs`: the bodies of the listed transactions the sender holds (self-certifying: a
    body counts only when it hashes to a listed id); a receiver that holds nothing of a
    listed id learns its deadline from it, to tell whether its memory covers that id
    (docs/LEADERLESS.md "Forgotten commits", `memory.py`)."""

    tx_ids: tuple[TxId, ...]
    delivered: tuple[NodeId, ...] = ()
    txs: tuple[Transaction, ...] = ()
    round: int = field(default=0, metadata=_OPTIONAL)
    """The re-checkpoint round (0 first; docs/LEADERLESS.md "Kept, then stuck", and
    "Rounds in the veto mode")."""


@dataclass(frozen=True, slots=True, kw_only=True)
class VetoChoice(Message):
    """A node's vote in the veto procedure of checkpoint `checkpoint` (the digest of its
    sorted `tx_ids`): `drop` True agrees to drop every one of them; False is a veto, and
    then `proofs` holds a verified proof that one of them is applicable."""

    checkpoint: bytes
    tx_ids: tuple[TxId, ...]
    voter: NodeId
    drop: bool
    proofs: tuple[TransactionProof, ...] = ()
    signature: bytes = b""
    round: int = field(default=0, metadata=_OPTIONAL)
    """The re-checkpoint round (0 first; `checkpoint` names it: docs/LEADERLESS.md "Rounds
    in the veto mode"); 0 is not sent, so older encodings are unchanged."""


@dataclass(frozen=True, slots=True, kw_only=True)
class VoteEcho(Message):
    """Bracha's ECHO of `vote` in the reliable-broadcast instance (`vote.voter`,
    `vote.checkpoint`): a node sends one, to every other node, on the first SEND (the
    voter's own `VetoChoice`) it received from the voter. Counts as the sender's."""

    vote: VetoChoice


@dataclass(frozen=True, slots=True, kw_only=True)
class VoteReady(Message):
    """Bracha's READY for the vote whose digest is `digest` in the instance (`voter`,
    `checkpoint`): sent once per instance, on Q matching echoes or f+1 matching readies.
    Counts as the sender's."""

    checkpoint: bytes
    voter: NodeId
    digest: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class VoteBatch(Message):
    """A node's ECHOes (`echoes`: the votes it echoes, each meaning `VoteEcho(vote)`) and
    READYs (`readies`) of any number of reliable-broadcast instances, collected since its
    last flush and sent to one peer in one message (`reliable_broadcast.py`, "batched"):
    one checkpoint's n broadcasts cost a node one message per peer and flush instead of
    one per broadcast. Counts as the sender's; each item is handled as if it came alone.
    At most `reliable_broadcast.MAX_BATCH_ITEMS` of each (a larger batch is dropped)."""

    echoes: tuple[VetoChoice, ...] = ()
    readies: tuple[VoteReady, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class VoteEchoDigest(Message):
    """Bracha's ECHO, by digest, in the instance (`voter`, `checkpoint`): the digest of the
    first valid SEND (the voter's `VetoChoice`) the sender received from the voter; the
    vote itself travels once, from its voter, and is fetched (`FetchVote`) by a node that
    must deliver a digest it lacks the body of. Counts as the sender's."""

    checkpoint: bytes
    voter: NodeId
    digest: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class VoteDigestBatch(Message):
    """A node's ECHOes (by digest) and READYs in the reliable-broadcast instances of ONE
    checkpoint, collected since its last flush and sent to one peer in one message (the
    successor of `VoteBatch`, whose echoes carried whole votes and repeated the checkpoint
    per item): item i of `echo_voters` and `echo_digests` means
    `VoteEchoDigest(checkpoint, echo_voters[i], echo_digests[i])`, likewise the readies.
    Counts as the sender's; each item is handled as if it came alone. Parallel tuples of
    equal length, at most `reliable_broadcast.MAX_BATCH_ITEMS` each (else dropped whole)."""

    checkpoint: bytes
    echo_voters: tuple[NodeId, ...] = ()
    echo_digests: tuple[bytes, ...] = ()
    ready_voters: tuple[NodeId, ...] = ()
    ready_digests: tuple[bytes, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchVote(Message):
    """Ask a peer that echoed `digest` in the instance (`voter`, `checkpoint`) for the vote
    with that digest: sent by a node that must deliver it (its own READY, or 2f+1 readies)
    and does not hold it. Answered by `VoteBody`."""

    checkpoint: bytes
    voter: NodeId
    digest: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class VoteBody(Message):
    """A vote (the voter's signed `VetoChoice`) sent to a node that asked for it
    (`FetchVote`): it counts only when its digest is the one the receiver is fetching in
    its instance (else `vote_body_mismatch`), and only when valid."""

    vote: VetoChoice


@dataclass(frozen=True, slots=True, kw_only=True)
class VoteRelay(Message):
    """This node's own reliable-broadcast choices in one instance (`voter`'s vote on
    `checkpoint`), in the durable record: the digest it echoed and the digest it sent READY
    for (b"": none yet). A restarted node never echoes or readies another value there."""

    checkpoint: bytes
    voter: NodeId
    echo: bytes = b""
    ready: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointDecision(Message):
    """A checkpoint this node decided (veto mode), in its durable record until `gc` forgets
    the checkpoint: its sorted ids, DROP or KEEP, and on KEEP the verified proofs of the
    deciding veto. A restarted node is decided on it again at once (`veto.py`)."""

    tx_ids: tuple[TxId, ...]
    drop: bool
    kept: tuple[TransactionProof, ...] = ()
    round: int = field(default=0, metadata=_OPTIONAL)
    """The checkpoint's round (its name is `checkpoint_id(tx_ids, round)`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchTransactions(Message):
    """Ask a peer for the transactions `tx_ids` (and what it knows of them): sent when an
    endorsement or a condition names an unknown transaction, or to catch up."""

    tx_ids: tuple[TxId, ...]
    held: bytes = field(default=b"", metadata=_OPTIONAL)
    """What the asker already holds of each id (`held.HeldMasks`: empty, or one bitmap of
    members per id whose unconditional endorsements it holds): the answer leaves those out,
    and is not sent when nothing is left (docs/LEADERLESS.md "Answers by what the asker
    holds"). Unsigned, like the ask: a false one only costs its asker."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CommittedDigest(Message):
    """Anti-entropy: the ids (sorted, unique) of transactions the sender committed and still
    holds; the receiver fetches the ones it does not know. Unsigned: acting on it never
    needs trust in the sender (what it fetches is self-certifying)."""

    tx_ids: tuple[TxId, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class DecidedTx(Message):
    """A decided transaction's tombstone in the durable record (committed or dropped),
    kept until its deadline is older than the garbage-collection horizon, so a late or
    replayed copy of it is recognised and ignored."""

    tx_id: TxId
    deadline_ms: int
    committed: bool


# Ordered resolution of stuck transactions (`stuck_resolution = "pbft"`, `ordered_veto.py`).


@dataclass(frozen=True, slots=True, kw_only=True)
class OrderingEnvelope(Message):
    """A message of the embedded PBFT instance that orders checkpoint votes (`message`: a
    PBFT message; the sender is `Receive.src`, as for every PBFT message)."""

    message: Message


@dataclass(frozen=True, slots=True, kw_only=True)
class OrderingSubmit(Message):
    """A node's own ordered item (`request.command`: an `OrderedVote` or a
    `CloseCheckpoint`), handed to every peer's embedded PBFT as a client's request would
    be (a backup then holds it and times the primary). Accepted only from the node whose
    client id it carries (`request.client_id == Receive.src`)."""

    request: ClientRequest


@dataclass(frozen=True, slots=True, kw_only=True)
class OrderedVote(Message):
    """A voter's signed vote on checkpoint `checkpoint` (the digest of its sorted
    `tx_ids` and `round`), ordered through the embedded PBFT: `evidence` is the voter's
    endorsement set for those transactions but the dead ones (a condition committed at the
    voter; per transaction at most one proof, sorted by transaction id; a commit
    certificate when the voter committed it)."""

    checkpoint: bytes
    tx_ids: tuple[TxId, ...]
    voter: NodeId
    evidence: tuple[TransactionProof, ...] = ()
    signature: bytes = b""
    round: int = field(default=0, metadata=_OPTIONAL)


@dataclass(frozen=True, slots=True, kw_only=True)
class CloseCheckpoint(Message):
    """`proposer` asks to decide checkpoint `checkpoint` on the votes ordered so far (it
    waited `close_ticks` since it heard of it); counts once f+1 distinct ones are ordered."""

    checkpoint: bytes
    tx_ids: tuple[TxId, ...]
    proposer: NodeId
    signature: bytes = b""
    round: int = field(default=0, metadata=_OPTIONAL)


@dataclass(frozen=True, slots=True, kw_only=True)
class OrderedCheckpointState(Message):
    """An undecided checkpoint in the ordered state: its ids, the counted votes (the first
    valid one of each voter, in order) and the distinct closers (in order)."""

    checkpoint: bytes
    tx_ids: tuple[TxId, ...]
    votes: tuple[OrderedVote, ...] = ()
    closers: tuple[NodeId, ...] = ()
    round: int = field(default=0, metadata=_OPTIONAL)


@dataclass(frozen=True, slots=True, kw_only=True)
class OrderingSnapshot(Message):
    """The ordered state after an executed sequence number (the embedded PBFT's checkpoint
    data; identical at every correct node): the hash chain of the executed commands, the
    undecided checkpoints, the most recently decided checkpoint ids and dropped transaction
    ids (oldest first, bounded)."""

    chain: bytes = b""
    open: tuple[OrderedCheckpointState, ...] = ()
    decided: tuple[bytes, ...] = ()
    dropped: tuple[TxId, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class OrderingRecord(Message):
    """The ordered-resolution part of the durable record: the embedded PBFT's record, the
    sequence number executed and the ordered state after it, this node's own votes of
    undecided checkpoints and the last request number it used (PBFT deduplicates a
    client's requests by increasing numbers)."""

    pbft: PbftDurableState = PbftDurableState()  # noqa: RUF009 (frozen: shared safely)
    executed: int = 0
    state: OrderingSnapshot = OrderingSnapshot()
    own: tuple[OrderedVote, ...] = ()
    request_no: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderlessDurableState(Message):
    """What the core must find again after a crash (`Ready.core_state`).

    Attributes:
        endorsed: this node's own signed endorsements not yet garbage-collected; the safety
            kernel never signs one that conflicts with them, across restarts too.
        refused: this node's own refusals, likewise (never endorse what it refused).
        votes: this node's own veto-procedure votes of the checkpoints it remembers,
            decided ones too until collected (a node that voted drop never commits those
            transactions unless the checkpoint keeps them; a restarted node never votes
            twice).
        relays: this node's echo and ready choices in the vote broadcasts of those
            checkpoints (`VoteRelay`), so it never echoes two values of one vote and its
            READYs still answer a lagging peer after a restart.
        decided: tombstones of committed and dropped transactions.
        committed: the committed transactions not yet garbage-collected, with their
            commit certificates. On restart the core releases every one of them again: the
            replica layer applies each transaction id once (its transaction table), so a
            crash between the WAL and this record never loses or doubles an apply.
        gc_horizon_ms: transactions whose deadline is older than this were collected; any
            transaction, endorsement or refusal of one older than it is ignored.
        known: the transactions behind `endorsed` and `refused` (so a restarted node can
            still tell which new transactions conflict with what it endorsed).
        released: how many of the first `committed` proofs were released (`Ready.committed`)
            before this record was written: on restart those are released again in order
            without the version gate (they passed it; the replica dedups the applied ones),
            the others go through the gate.
        fence_until_ms: the amnesia fence (`fence.py`): this node signs nothing before its
            clock reaches it (0: none).
        released_at: the local index each of those `released` proofs was released at. A
            restart re-releases only those beyond the replica's applied index (at the same
            indexes): the ones it applied keep their index and are not released twice
            (empty, e.g. in an older record: every one is released again).
        ordering: the ordered resolution's part (`stuck_resolution = "pbft"`); None in
            the veto mode.
        veto_decisions: the veto mode's decisions of the checkpoints in `votes`/`relays`
            (`CheckpointDecision`, in decision order), until collected; None when there are
            none (and in older records, which lack the field).
    """

    endorsed: tuple[Endorsement, ...] = ()
    refused: tuple[Refusal, ...] = ()
    votes: tuple[VetoChoice, ...] = ()
    decided: tuple[DecidedTx, ...] = ()
    committed: tuple[TransactionProof, ...] = ()
    gc_horizon_ms: int = 0
    known: tuple[Transaction, ...] = ()
    released: int = 0
    fence_until_ms: int = 0
    released_at: tuple[int, ...] = ()
    relays: tuple[VoteRelay, ...] = ()
    ordering: OrderingRecord | None = None
    veto_decisions: tuple[CheckpointDecision, ...] | None = field(default=None,
                                                                  metadata=_OPTIONAL)


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderlessStateDelta(Message):
    """The change from one `LeaderlessDurableState` to the next, for the core-state journal
    (`durable.LeaderlessDeltaRules`): per tuple field of the record, the positions removed
    from the previous record's tuple (sorted) and the items appended (`released_at` too: it
    holds an index per released proof of the horizon); the small fields whole; `ordering`
    whole when it changed (None: unchanged); `veto_decisions` like a tuple field, None for
    an empty part (absent from older deltas)."""

    endorsed_removed: tuple[int, ...] = ()
    endorsed_added: tuple[Endorsement, ...] = ()
    refused_removed: tuple[int, ...] = ()
    refused_added: tuple[Refusal, ...] = ()
    votes_removed: tuple[int, ...] = ()
    votes_added: tuple[VetoChoice, ...] = ()
    decided_removed: tuple[int, ...] = ()
    decided_added: tuple[DecidedTx, ...] = ()
    committed_removed: tuple[int, ...] = ()
    committed_added: tuple[TransactionProof, ...] = ()
    known_removed: tuple[int, ...] = ()
    known_added: tuple[Transaction, ...] = ()
    gc_horizon_ms: int = 0
    released: int = 0
    fence_until_ms: int = 0
    released_at_removed: tuple[int, ...] = ()
    released_at_added: tuple[int, ...] = ()
    relays_removed: tuple[int, ...] = ()
    relays_added: tuple[VoteRelay, ...] = ()
    ordering: OrderingRecord | None = None
    veto_decisions_removed: tuple[int, ...] | None = field(default=None, metadata=_OPTIONAL)
    veto_decisions_added: tuple[CheckpointDecision, ...] | None = field(default=None,
                                                                        metadata=_OPTIONAL)


LEADERLESS_MESSAGES: dict[int, type] = {
    300: Requirement,
    301: Transaction,
    302: Endorsement,
    303: Refusal,
    304: TransactionProof,
    305: StartCheckpoint,
    306: VetoChoice,
    307: FetchTransactions,
    308: CommittedDigest,
    309: VoteEcho,
    310: VoteReady,
    311: VoteBatch,
    312: VoteEchoDigest,
    313: VoteDigestBatch,
    314: FetchVote,
    315: VoteBody,
    320: DecidedTx,
    321: LeaderlessDurableState,
    322: LeaderlessStateDelta,
    323: VoteRelay,
    324: EndorsementRoot,
    325: EndorsedTx,
    326: EndorsementBatch,
    327: CheckpointDecision,
    **TRANSFER_MESSAGES,  # 330-333: state transfer (`transfer_messages.py`)
    340: OrderingEnvelope,
    341: OrderedVote,
    342: CloseCheckpoint,
    343: OrderingRecord,
    344: OrderedCheckpointState,
    345: OrderingSnapshot,
    346: OrderingSubmit,
    350: SignatureResend,
    **PBFT_MESSAGES,  # the embedded PBFT of `stuck_resolution = "pbft"` (its own ids)
}
"""Stable codec type ids (never renumber): register with `phalanx.net.wire.register_all`.
The core may add messages in 316-319 and records in 328-339 and 351-399 (311: batched echoes
and readies; 312-315: echoes by digest, their batch, the body fetch and answer; 324-326:
batch endorsements; 327: a veto decision in the record; 340-346: the ordered resolution;
350: re-sent signatures)."""
