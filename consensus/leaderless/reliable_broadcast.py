"""Bracha's reliable broadcast (Bracha 1987) of veto-procedure votes, as a sans-IO sub-machine,
with echoes by digest.

Owns: `VoteBroadcast`: one instance per (voter, checkpoint id): the vote contents it holds
(by digest), the first ECHO and READY of every member, this node's own ECHO and READY
choices, the body it fetches, and the delivered vote. The checkpoint machine (`veto.py`)
owns which instances exist (`open`/`forget`), validates vote contents (`Validate`,
deterministic across correct nodes), persists `relays()` before sending, calls `refetch`
once per checkpoint period, and decides only from `drain().delivered`.

Protocol (n >= 3f+1; Q = ceil((n+f+1)/2) = 2f+1 at n = 3f+1):
- SEND: the voter's signed `VetoChoice`, accepted only from the voter itself (`Receive.src`
  is authenticated by the transport). The body travels once, in the SEND.
- ECHO (`VoteEchoDigest`, the vote's digest): sent once per instance, on the first valid SEND.
- READY (`VoteReady`, the digest): sent once per instance, on Q matching echoes or f+1
  matching readies.
- DELIVER: on 2f+1 matching readies, once the vote with that digest is held (from the SEND,
  a fetched `VoteBody`, or an older node's full `VoteEcho`: the digest authenticates it).
- FETCH: a node that readied digest d (or holds 2f+1 readies of d) without the body asks
  f+1 distinct members whose echo was d (`FetchVote`), as their echoes arrive, and every
  period (`refetch`) f+1 more (round robin over d's echoers) until it holds it; a member
  answers a fetch of a body it holds with `VoteBody`, once per period per asker. A body
  whose digest is not the one being fetched is dropped (`vote_body_mismatch`). A node's own
  instance, after it lost its vote: f+1 echoes of one digest make it fetch that body (its
  old vote, then adopted).

Batched (`batch_ticks` > 0, the core's default; docs/LEADERLESS.md "Batched echoes and
readies"): ECHOes and READYs are not sent at once but collected, per peer, and sent every
`batch_ticks` ticks (`tick`) as one `VoteDigestBatch` per peer and checkpoint carrying all of
them (the checkpoint once, then voter and digest per item: ~40 bytes an item). The SEND,
fetches and bodies go at once. A received batch is handled item by item, each exactly as
the lone `VoteEchoDigest`/`VoteReady` it stands for, in one loop (`on_digest_items`: no
Python call per item unless its instance can move): a bad item is dropped and counted, the
others count. Pending items are keyed by instance, so at most one echo and one ready per
instance and peer wait; a batch carries at most `MAX_BATCH_ITEMS` of each (more go in
further batches of the same flush; the flush itself is `vote_flush.py`'s).

Properties (f Byzantine members): two Q-sets of echoers share f+1 members, one correct, and
a correct node echoes once, so at most one digest ever gets a READY from a correct node;
delivery needs f+1 correct readies, which make every correct node ready that digest and so
deliver it (totality, given resends: `answer`), once it holds the body: the first correct
READY of d came from Q echoes of d, of which f+1 are correct, and a correct node echoes
only a body it validated and holds; f+1 distinct echoers of d include one of them, so the
fetch succeeds (docs/LEADERLESS.md "Echoes by digest"). Hence per instance every correct
node delivers the same vote or none, and with a correct voter all deliver its vote.

Invariants: deterministic (insertion-ordered dicts, members sorted); peer input is counted
by the caller's reason names, never raised; per instance at most n+1 contents are held
(the SEND, each member's first full echo, the fetched body: only the fetched digest).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from phalanx.consensus.core import Send
from phalanx.consensus.crypto import Hasher, digest_of
from phalanx.consensus.leaderless.messages import (
    FetchVote,
    VetoChoice,
    VoteBody,
    VoteEcho,
    VoteEchoDigest,
    VoteReady,
    VoteRelay,
)
from phalanx.consensus.leaderless.vote_flush import MAX_BATCH_ITEMS, Key, Pending, batches
from phalanx.consensus.types import LocalProtocolError, Message, NodeId

__all__ = ["MAX_BATCH_ITEMS", "Key", "Validate", "VoteBroadcast"]

Validate = Callable[[VetoChoice], str | None]
"""Why a vote's content is invalid (a drop reason), or None: must give the same answer on
every correct node (signatures and self-certifying proofs only, never local state)."""

@dataclass(slots=True)
class _Instance:
    contents: dict[bytes, VetoChoice] = field(default_factory=dict)
    """Valid contents held, by digest."""
    invalid: dict[bytes, str] = field(default_factory=dict)
    """Contents found invalid, by digest: the reason (bounded: n+1)."""
    sent: bytes | None = None
    """The digest of the voter's first SEND."""
    echoes: dict[NodeId, bytes] = field(default_factory=dict)
    readies: dict[NodeId, bytes] = field(default_factory=dict)
    echo: bytes | None = None
    """This node's own ECHO (a digest), durable."""
    ready: bytes | None = None
    """This node's own READY, durable."""
    delivered: bytes | None = None
    echo_counts: dict[bytes, int] = field(default_factory=dict)
    """How many members' first ECHO is each digest (`echoes` counted, kept with it)."""
    ready_counts: dict[bytes, int] = field(default_factory=dict)
    """How many members' first READY is each digest (`readies` counted)."""
    fetching: bytes | None = None
    """The digest whose body this node must obtain (set once: see `_want`)."""
    asked: dict[NodeId, None] = field(default_factory=dict)
    """Echoers of `fetching` asked for it, across periods (cleared once all known ones
    were: the next period starts over)."""
    asked_now: int = 0
    """How many of them were asked this period (at most f+1)."""

    def add_echo(self, src: NodeId, digest: bytes) -> None:
        """`src`'s first ECHO (the caller checked it has none)."""
        self.echoes[src] = digest
        self.echo_counts[digest] = self.echo_counts.get(digest, 0) + 1

    def add_ready(self, src: NodeId, digest: bytes) -> None:
        """`src`'s first READY (the caller checked it has none)."""
        self.readies[src] = digest
        self.ready_counts[digest] = self.ready_counts.get(digest, 0) + 1

    def held_digest(self, vote: VetoChoice) -> bytes | None:
        """The digest of `vote` when it is one of the held contents (usually the SEND's
        object itself): no re-encoding and hashing."""
        for digest, held in self.contents.items():
            if held is vote or held == vote:
                return digest
        return None


class VoteBroadcast:
    """The reliable broadcast of votes at one node."""

    __slots__ = ("_batch_ticks", "_counts", "_deliver_at", "_delivered", "_dirty", "_echo_at",
                 "_faults", "_hasher", "_instances", "_members", "_nodes", "_out_all", "_out_to",
                 "_ready_at", "_sends", "_served", "_ticks", "_wanting", "fenced", "node_id")

    def __init__(self, *, node_id: NodeId, nodes: tuple[NodeId, ...], faults: int,
                 hasher: Hasher, restored: Iterable[VoteRelay] = (),
                 batch_ticks: int = 0) -> None:
        """`batch_ticks`: 0 sends every ECHO and READY at once, alone; k > 0 batches them
        per peer and sends the batches every k ticks (`tick`)."""
        n = len(nodes)
        if n < 3 * faults + 1 or faults < 0:
            raise LocalProtocolError(f"reliable broadcast needs n >= 3f+1 (n={n}, f={faults})")
        if batch_ticks < 0:
            raise LocalProtocolError(f"batch_ticks must be >= 0, got {batch_ticks}")
        self._batch_ticks = batch_ticks
        self._ticks = 0
        self._out_all = Pending()
        """Batched: what goes to every peer at the next flush."""
        self._out_to: dict[NodeId, Pending] = {}
        """Batched: what goes to one peer only (answers to its pulls)."""
        self.node_id = node_id
        self._nodes = tuple(sorted(nodes))
        self._members = frozenset(nodes)
        self._hasher = hasher
        self._faults = faults
        self._echo_at = -(-(n + faults + 1) // 2)
        self._ready_at = faults + 1
        self._deliver_at = 2 * faults + 1
        self._instances: dict[Key, _Instance] = {}
        self._wanting: dict[Key, None] = {}
        """Instances whose `fetching` body is not held yet."""
        self._served: dict[tuple[NodeId, Key], None] = {}
        """(asker, instance) fetches answered this period (one each)."""
        self._sends: list[Send] = []
        self._delivered: list[VetoChoice] = []
        self._counts: dict[str, int] = {}
        self._dirty = False
        self.fenced = False
        """While set, this node echoes and readies nothing (it still records, fetches and
        delivers): the amnesia fence of a node that lost its choices."""
        for relay in restored:
            inst = self._instances.setdefault((relay.voter, relay.checkpoint), _Instance())
            inst.echo = relay.echo or None
            inst.ready = relay.ready or None
            if inst.echo is not None:
                inst.add_echo(node_id, inst.echo)
            if inst.ready is not None:
                inst.add_ready(node_id, inst.ready)

    # Instances -------------------------------------------------------------------------

    def open(self, key: Key) -> None:
        """Accept messages of instance `key` from now on."""
        self._instances.setdefault(key, _Instance())

    def known(self, key: Key) -> bool:
        return key in self._instances

    def forget(self, key: Key) -> None:
        self._instances.pop(key, None)
        self._wanting.pop(key, None)

    def delivered(self, key: Key) -> VetoChoice | None:
        inst = self._instances.get(key)
        if inst is None or inst.delivered is None:
            return None
        return inst.contents[inst.delivered]

    def relays(self, keys: Iterable[Key]) -> tuple[VoteRelay, ...]:
        """This node's choices in the instances `keys` (for the durable record)."""
        out = []
        for key in keys:
            inst = self._instances.get(key)
            if inst is not None and (inst.echo is not None or inst.ready is not None):
                out.append(VoteRelay(checkpoint=key[1], voter=key[0], echo=inst.echo or b"",
                                     ready=inst.ready or b""))
        return tuple(out)

    def orphans(self, has_checkpoint: Callable[[bytes], bool]) -> tuple[Key, ...]:
        """Instances (restored ones) whose checkpoint `has_checkpoint` does not know."""
        return tuple(k for k in self._instances if not has_checkpoint(k[1]))

    # Inputs ----------------------------------------------------------------------------

    def broadcast(self, vote: VetoChoice) -> None:
        """Reliably broadcast this node's own signed `vote` (its instance must be open)."""
        if vote.voter != self.node_id:
            raise LocalProtocolError(f"{self.node_id!r} cannot broadcast {vote.voter!r}'s vote")
        self._to_all(vote)
        self.on_send(self.node_id, vote, lambda _v: None)

    def on_send(self, src: NodeId, vote: VetoChoice, validate: Validate) -> None:
        """The voter's SEND (the caller checked `src == vote.voter`)."""
        key = (vote.voter, vote.checkpoint)
        inst = self._instances.get(key)
        if inst is None:
            self._count("unknown_instance")
            return
        if inst.sent is not None:
            if inst.sent != self._digest(vote):
                self._count("equivocation")  # the first SEND is the only one echoed
            return
        digest = self._content(inst, vote, validate)
        if digest is None:
            return
        inst.sent = digest
        if inst.echo is None and not self.fenced:
            inst.echo = digest
            self._dirty = True
            if self._batch_ticks:
                self._out_all.echoes[key] = digest
            else:
                self._to_all(VoteEchoDigest(checkpoint=key[1], voter=key[0], digest=digest))
            self._echo(key, inst, self.node_id, digest)

    def on_echo(self, src: NodeId, msg: VoteEcho, validate: Validate) -> None:
        """An older node's full ECHO (the vote itself): its echo, and a content."""
        vote = msg.vote
        key = (vote.voter, vote.checkpoint)
        inst = self._instances.get(key)
        if inst is None:
            self._count("unknown_instance")
            return
        first = inst.echoes.get(src)
        if first is not None:
            if first != self._digest(vote):
                self._count("echo_equivocation")
            return
        digest = self._content(inst, vote, validate)
        if digest is not None:
            self._echo(key, inst, src, digest)
        else:
            inst.add_echo(src, b"")  # its one echo, spent on an invalid vote

    def on_echo_digest(self, src: NodeId, key: Key, digest: bytes) -> None:
        """`src`'s ECHO, by digest, in instance `key`."""
        inst = self._instances.get(key)
        if inst is None:
            self._count("unknown_instance")
            return
        if not self._spoke(inst.echoes, src, digest, "echo_equivocation"):
            self._echo(key, inst, src, digest)

    def on_ready(self, src: NodeId, msg: VoteReady) -> None:
        self.on_ready_digest(src, (msg.voter, msg.checkpoint), msg.digest)

    def on_ready_digest(self, src: NodeId, key: Key, digest: bytes) -> None:
        """`src`'s READY of `digest` in instance `key`."""
        inst = self._instances.get(key)
        if inst is None:
            self._count("unknown_instance")
            return
        if self._spoke(inst.readies, src, digest, "ready_equivocation"):
            return
        inst.add_ready(src, digest)
        self._progress(key, inst, digest)

    def on_digest_items(self, src: NodeId, cid: bytes, voters: tuple[object, ...],
                        digests: tuple[object, ...], *, echo: bool) -> None:
        """The ECHOes (`echo`) or READYs of one `VoteDigestBatch` from member `src` (the
        caller checked the batch's shape: parallel tuples, bounded), each exactly as the
        lone `on_echo_digest`/`on_ready_digest` of its own instance (`(voter, cid)`) after
        the per-item checks of the lone message (types: `bad_vote_batch_item`; a voter
        not a member: `not_a_member`; an instance not open: `unknown_checkpoint`), in one
        loop: an item whose instance cannot move (below every threshold with the body
        held, or readied and delivered) is recorded and counted with no further call
        (`_progress` would do nothing); the others go to `_progress` as before. The n^3
        items of a checkpoint are the broadcast's hot loop (docs/LEADERLESS.md "Items in
        bulk")."""
        instances = self._instances
        members = self._members
        echo_at, ready_at, deliver_at = self._echo_at, self._ready_at, self._deliver_at
        for voter, digest in zip(voters, digests, strict=True):
            if not isinstance(voter, str) or not isinstance(digest, bytes):
                self._count("bad_vote_batch_item")
                continue
            if voter not in members:
                self._count("not_a_member")
                continue
            inst = instances.get((voter, cid))  # type: ignore[arg-type]  # a member: a NodeId
            if inst is None:
                self._count("unknown_checkpoint")  # the sender sends it again when pulled
                continue
            if echo:
                first = inst.echoes.get(src)
                if first is not None:
                    if first != digest:
                        self._count("echo_equivocation")
                    continue
                inst.echoes[src] = digest
                counts = inst.echo_counts
                c = counts[digest] = counts.get(digest, 0) + 1
                ready = inst.ready
                if ready is None:
                    if c < echo_at and digest in inst.contents \
                            and inst.ready_counts.get(digest, 0) < ready_at:
                        continue  # no READY (both counts below) and no delivery
                elif inst.delivered is not None or (
                        ready in inst.contents
                        and inst.ready_counts.get(ready, 0) < deliver_at):
                    continue  # readied: an echo moves no ready count
            else:
                first = inst.readies.get(src)
                if first is not None:
                    if first != digest:
                        self._count("ready_equivocation")
                    continue
                inst.readies[src] = digest
                counts = inst.ready_counts
                c = counts[digest] = counts.get(digest, 0) + 1
                if inst.ready is None:
                    if c < ready_at and digest in inst.contents \
                            and inst.echo_counts.get(digest, 0) < echo_at:
                        continue  # as for an echo: below f+1 < 2f+1 and Q
                elif inst.delivered is not None:
                    continue
                elif digest == inst.ready and c < deliver_at and digest in inst.contents:
                    continue  # short of 2f+1 readies of the digest it readied, body held
            self._progress((voter, cid), inst, digest)  # type: ignore[arg-type]

    def _spoke(self, seen: dict[NodeId, bytes], src: NodeId, digest: bytes,
               equivocation: str) -> bool:
        """Whether `src` already echoed (readied) in this instance: only its first counts;
        a different later one is counted as `equivocation`."""
        first = seen.get(src)
        if first is None:
            return False
        if first != digest:
            self._count(equivocation)
        return True

    def on_fetch(self, src: NodeId, msg: FetchVote) -> None:
        """A peer asks for the body of `msg.digest`: answered at once when held, once per
        period (`refetch`) per asker and instance."""
        key = (msg.voter, msg.checkpoint)
        inst = self._instances.get(key)
        if inst is None:
            self._count("unknown_instance")
            return
        vote = inst.contents.get(msg.digest)
        if vote is None:
            self._count("vote_fetch_unheld")  # e.g. lost in a crash: another echoer has it
            return
        if (src, key) in self._served:
            self._count("vote_fetch_repeat")
            return
        self._served[(src, key)] = None
        self._sends.append(Send(to=src, message=VoteBody(vote=vote)))

    def expects(self, vote: VetoChoice) -> bool:
        """Whether `vote` is the body this node is fetching in its instance (else counted:
        `unknown_instance`, `vote_body_mismatch`, or a duplicate answer)."""
        inst = self._instances.get((vote.voter, vote.checkpoint))
        if inst is None:
            self._count("unknown_instance")
            return False
        if inst.fetching is None or inst.fetching in inst.contents:
            self._count("vote_body_unasked")  # not fetching (any more): a late duplicate
            return False
        if self._digest(vote) != inst.fetching:
            self._count("vote_body_mismatch")
            return False
        return True

    def on_body(self, vote: VetoChoice, validate: Validate) -> None:
        """The fetched body (the caller checked `expects(vote)`): held from now on, when
        valid (a correct echoer only echoes valid contents)."""
        inst = self._instances.get((vote.voter, vote.checkpoint))
        if inst is not None:
            self._content(inst, vote, validate)

    def refetch(self) -> None:
        """Once per period: ask again for every body still missing (the answers may have
        been lost), and accept one more fetch from every asker."""
        self._served.clear()
        for key in tuple(self._wanting):
            inst = self._instances.get(key)
            if inst is None or inst.fetching is None or inst.fetching in inst.contents:
                del self._wanting[key]
                continue
            inst.asked_now = 0
            want = inst.fetching
            if all(d != want or src == self.node_id or src in inst.asked
                   for src, d in inst.echoes.items()):
                inst.asked.clear()  # every known echoer asked: start over
            self._ask(key, inst)

    def answer(self, key: Key, to: NodeId) -> list[Send]:
        """This node's messages of instance `key`, again, for peer `to` (loss recovery):
        its SEND when it is the voter, its ECHO and READY (batched: those two wait for the
        next flush, in `to`'s batch)."""
        inst = self._instances.get(key)
        if inst is None:
            return []
        out: list[Message] = []
        if key[0] == self.node_id and inst.sent is not None:
            out.append(inst.contents[inst.sent])
        pending = self._out_to.setdefault(to, Pending()) if self._batch_ticks else None
        if inst.echo is not None:
            if pending is None:
                out.append(VoteEchoDigest(checkpoint=key[1], voter=key[0], digest=inst.echo))
            else:
                pending.echoes[key] = inst.echo
        if inst.ready is not None:
            if pending is None:
                out.append(VoteReady(checkpoint=key[1], voter=key[0], digest=inst.ready))
            else:
                pending.readies[key] = inst.ready
        return [Send(to=to, message=m) for m in out]

    def tick(self) -> None:
        """Batched: every `batch_ticks` ticks, flush the pending echoes and readies (into
        the sends `drain` returns): one `VoteDigestBatch` per peer and checkpoint (more past
        `MAX_BATCH_ITEMS`), the same objects for every peer that has no answer of its own
        pending."""
        if not self._batch_ticks:
            return
        self._ticks += 1
        if self._ticks % self._batch_ticks:
            return
        shared, self._out_all = self._out_all, Pending()
        own, self._out_to = self._out_to, {}
        common = batches(shared) if shared else []
        for peer in self._nodes:
            extra = own.get(peer)
            if peer == self.node_id:
                continue
            if extra:
                merged = Pending(echoes={**shared.echoes, **extra.echoes},
                                  readies={**shared.readies, **extra.readies})
                self._sends.extend(Send(to=peer, message=b) for b in batches(merged))
            else:
                self._sends.extend(Send(to=peer, message=b) for b in common)

    def drain(self) -> tuple[list[Send], list[VetoChoice], bool]:
        """(sends, newly delivered votes, whether own choices changed: persist before
        sending) accumulated since the last drain."""
        out = (self._sends, self._delivered, self._dirty)
        self._sends, self._delivered, self._dirty = [], [], False
        return out

    def dropped_counts(self) -> dict[str, int]:
        return dict(self._counts)

    # Internals -------------------------------------------------------------------------

    def _count(self, reason: str) -> None:
        self._counts[reason] = self._counts.get(reason, 0) + 1

    def _digest(self, vote: VetoChoice) -> bytes:
        return digest_of(self._hasher, vote)

    def _content(self, inst: _Instance, vote: VetoChoice, validate: Validate) -> bytes | None:
        """The digest of `vote` if it is valid (held from now on), else None (counted)."""
        digest = inst.held_digest(vote)
        if digest is not None:
            return digest
        digest = self._digest(vote)
        if digest in inst.invalid:
            self._count(inst.invalid[digest])
            return None
        if len(inst.contents) > len(self._nodes):
            self._count("too_many_contents")
            return None
        problem = validate(vote)
        if problem is not None:
            if len(inst.invalid) <= len(self._nodes):
                inst.invalid[digest] = problem
            self._count(problem)
            return None
        inst.contents[digest] = vote
        self._progress((vote.voter, vote.checkpoint), inst, digest)
        return digest

    def _to_all(self, msg: Message) -> None:
        self._sends.extend(Send(to=p, message=msg) for p in self._nodes if p != self.node_id)

    def _echo(self, key: Key, inst: _Instance, src: NodeId, digest: bytes) -> None:
        inst.add_echo(src, digest)
        self._progress(key, inst, digest)

    def _progress(self, key: Key, inst: _Instance, digest: bytes) -> None:
        """The counts are kept as echoes and readies are stored (O(1) here: a scan of every
        member's was O(n) per message, O(n^4) per checkpoint for the cluster)."""
        if inst.ready is None and not self.fenced and (
                inst.echo_counts.get(digest, 0) >= self._echo_at
                or inst.ready_counts.get(digest, 0) >= self._ready_at):
            inst.ready = digest
            if self.node_id not in inst.readies:
                inst.add_ready(self.node_id, digest)
            self._dirty = True
            if self._batch_ticks:
                self._out_all.readies[key] = digest
            else:
                self._to_all(VoteReady(checkpoint=key[1], voter=key[0], digest=digest))
        if inst.delivered is None:
            d = digest if inst.ready is None else inst.ready
            if d in inst.contents:
                if inst.ready_counts.get(d, 0) >= self._deliver_at:
                    inst.delivered = d
                    self._delivered.append(inst.contents[d])
            elif inst.fetching is None:
                self._want(key, inst, d)
            elif inst.fetching == d and inst.asked_now <= self._faults:
                self._ask(key, inst)  # a new echoer of it, maybe

    def _want(self, key: Key, inst: _Instance, d: bytes) -> None:
        """Fetch the body of `d` when this node must deliver it: it readied `d`, or holds
        2f+1 readies of it (a fenced node), or, in its own instance without its own vote
        (lost), f+1 members echoed `d` (one correct: its old vote, to adopt)."""
        if inst.ready == d or inst.ready_counts.get(d, 0) >= self._deliver_at or (
                key[0] == self.node_id and inst.sent is None
                and inst.echo_counts.get(d, 0) > self._faults):
            inst.fetching = d
            self._wanting[key] = None
            self._ask(key, inst)

    def _ask(self, key: Key, inst: _Instance) -> None:
        """Ask echoers of `inst.fetching` not asked yet until f+1 were asked this period:
        one of f+1 distinct echoers is correct, and a correct echoer holds the body (unless
        it lost it in a crash: the next period asks the next ones)."""
        want = inst.fetching
        if want is None:
            return
        for src, d in inst.echoes.items():
            if inst.asked_now > self._faults:
                return
            if d == want and src != self.node_id and src not in inst.asked:
                inst.asked[src] = None
                inst.asked_now += 1
                self._sends.append(Send(to=src, message=FetchVote(
                    checkpoint=key[1], voter=key[0], digest=want)))
