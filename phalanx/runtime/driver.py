"""The trio driver of one consensus core: the `Ready` ordering rule with group commit.

Owns: `Driver`, which runs ONE core, its replica layer and its group committer under trio.
One task (`Driver.run`'s core loop) owns the core, the replica and every client waiter, so
nothing is locked: every other task talks to it through one bounded memory channel of items
(peer messages, ticks, client calls, status requests, persistence completions, client
disconnects). A sender blocks while the channel is full (backpressure).

Group commit, and the ordering rule of `phalanx.consensus.core.Ready`:
- A Ready's `early_messages` (step 0) are held until the pass's client replies are out,
  then go to the transport, in step order: at the end of the pass, or before any write the
  pass starts, whichever comes first (`_release_early`). So a leader's AppendEntries leave
  before its own disk write, and its commit notices (which wake both followers) leave after
  the reply they follow; `lazy` ones (a Raft leader's commit notices) wait further, for the
  next message to their peer (which may supersede them: then they are dropped) or the next
  tick (`phalanx.runtime.driver_output.PeerOutput`).
- The transport holds a pass's frames (`flush_sends`): each peer's leave in one write, at
  the end of the pass, before any write the pass starts, and after a batch's messages.
- Every Ready a step returns is queued, in step order, in `_pending`.
- When no batch is being persisted, the Readys at the head of the queue that write nothing
  durable (commit notices, heartbeat answers) are completed at once; the rest becomes one
  batch, persisted with one fsync on a worker thread (`trio.to_thread.run_sync`) while the
  core loop keeps stepping new inputs into the next batch. `idle_inline` persists a small
  batch on the core task when no input waits (each thread hand-off can wait out a GIL
  switch interval; docs/BENCHMARKS.md, design measurements). Before such a write
  blocks the event loop, messages and replies handed out are on the wire: the transport and
  the client port write them directly from this task when nothing is queued before them
  (`after_pass` flushes the pass's replies); whatever still waits for a writer task
  (`output_pending`) is let go by yielding first. So a leader's AppendEntries leave during
  its fsync, and a phase's votes are not held behind the next phase's fsync.
- Completing a batch: release the messages of all its Readys to the transport (in Ready
  order; then `flush_sends`), then, in Ready order, apply committed entries through the
  replica and answer their clients, answer rejections (REDIRECT/RETRY), aborts (ABORTED,
  a definite failure) and reads whose index is applied; then feed `Persisted(last
  number)` back, then the replica's `CheckpointTaken`s. A later Ready's messages may thus
  leave before an earlier Ready's entries are applied: step 2 depends only on step 1,
  done for the whole batch, and a message is computed when its Ready is, never from what
  the driver applies later; steps 3-5 keep Ready order. So a follower's answer never waits
  behind its applies. No message other than an early one ever leaves before its Ready is
  durable.
- Client writes that arrive in one pass over the input channel are stepped together at the
  end of the pass (`propose_batch`: one log entry, one AppendEntries per follower).
- The replica (and so the WAL, which it compacts) is only touched by the core task while no
  batch is on the worker thread; the worker thread touches storage only. The "core task" is
  the core loop, or a peer link's reading task running a whole pass while the core loop is
  parked on an empty channel (`phalanx.runtime.driver_inline`: one task switch fewer per
  message); never both at once.

Must not import: sockets, TLS, prometheus (metrics arrive as an injected `DriverObserver`),
any particular core (the core is injected; only the `Core` contract is used).

Code: the Driver's bases own parts of it: `driver_calls.CallAdmission` (client calls),
`driver_persist.PersistPipeline` (step 1), `driver_apply.BatchCompletion` (steps 2-5 of a
durable batch), `driver_ticks.TickPacing` (idle stride) and `driver_inline.InlineSteps`
(passes stepped in a reading task); this module owns the core loop and the core task's
stepping, ticks and status.

Client calls are admitted by `phalanx.runtime.driver_calls.CallAdmission` (a base class: stale
reads, session-table answers, backpressure, duplicate joins, proposal batching).
Backpressure: a leader holding `max_pending_calls` unanswered calls answers a NEW write with
RETRY naming itself as leader (the client backs off and comes back to it) instead of queueing
it; a retry of a write already waiting joins it (never a second proposal). Each client
connection is also bounded (`phalanx.runtime.client_port`), so the input channel stays short and a
tick waits at most one drained pass (`DRAIN_LIMIT` items); passes longer than
`SLOW_PASS_TICKS` ticks are counted (`slow_passes`, exported by the node's metrics).

Storage failures (disk full, EIO) make the driver *storage-unavailable* instead of stopping
the node (`phalanx.runtime.driver_persist`): the failed batch is held and retried, the core is not
stepped (peer messages are dropped, ticks only time the retries), client calls other than
stale reads are answered `ReplyStatus.UNAVAILABLE`, status calls as usual.

Time: ticks come from a periodic timer (`phalanx.runtime.ticker.Ticker`: a timerfd, else trio's
clock) every `tick_seconds`, each carrying the wall clock (`Tick.now_ms`, for cores whose
inputs carry absolute deadlines); a loop that falls behind more than `MAX_CATCH_UP_TICKS` ticks
skips them instead of bursting. While the node is quiet the ticker wakes once per
`idle_stride` ticks (`phalanx.runtime.driver_ticks`); the per-tick housekeeping (`_on_tick`)
runs once per pass that stepped ticks. With `fresh_clock` an input that finds the core's
reading stale is preceded by a `Tick` with the current time (`phalanx.runtime.fresh_clock`).
Inputs are queued with `send_nowait` first (`_put`), so a message costs no extra scheduler
pass while the channel has room. Client errors are normal input: an unknown request never
raises.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import TypeAlias

import trio

from phalanx.apps.replica import Replica
from phalanx.consensus.core import (
    Core,
    CoreStatus,
    Input,
    ReadState,
    Ready,
    Receive,
    Tick,
)
from phalanx.consensus.types import ClientRequest, Message, NodeId
from phalanx.net.client_protocol import ClientCall, StatusReply
from phalanx.runtime.driver_apply import BatchCompletion
from phalanx.runtime.driver_calls import (
    MAX_PENDING_CALLS,
    PROPOSAL_MAX_BYTES,
    PROPOSAL_MAX_REQUESTS,
    CallAdmission,
    CallInput,
    CallsInput,
    DisconnectInput,
    StatusInput,
)
from phalanx.runtime.driver_inline import InlineSteps, _Wake
from phalanx.runtime.driver_output import PeerOutput
from phalanx.runtime.driver_persist import (
    EARLY_WRITE_CHECKPOINTS,
    PersistPipeline,
    _BatchDone,
    is_storage_failure,
)
from phalanx.runtime.driver_stats import DriverObserver, DriverStatistics
from phalanx.runtime.driver_ticks import MAX_CATCH_UP_TICKS, TickPacing, wall_clock_ms
from phalanx.runtime.fresh_clock import FreshClock
from phalanx.runtime.group_commit import GroupCommitter
from phalanx.runtime.phase_trace import PhaseTrace
from phalanx.runtime.waiters import ClientWaiters, ReplyTarget

__all__ = ["DRAIN_LIMIT", "MAX_CATCH_UP_TICKS", "MAX_PENDING_CALLS", "PROPOSAL_MAX_BYTES",
           "PROPOSAL_MAX_REQUESTS", "Driver"]

logger = logging.getLogger(__name__)

DRAIN_LIMIT = 512
"""Items the core loop takes without yielding before it flushes (bounds batch latency)."""

SLOW_PASS_TICKS = 5
"""A pass of the core loop longer than this many ticks is counted in `slow_passes`: while it
runs, no tick, heartbeat or vote is handled."""

COMMIT_FLUSH_TICKS = 1000
"""A deferred commit-only hard state is written at most every this many ticks (10 s at the
default 10 ms tick). Each write is a temp file, an fsync, a rename and a directory fsync that
holds up the persistence pipeline; restoring `commit` is only an optimisation."""


_Item: TypeAlias = (Input | CallInput | CallsInput | StatusInput | DisconnectInput | _BatchDone
                   | _Wake)


class Driver(CallAdmission, PersistPipeline, TickPacing, InlineSteps, BatchCompletion):
    """Runs `core` with `replica` and `committer` under trio (see the module docstring).

    Args:
        core: the consensus core (freshly built from the durable state).
        replica: the replica layer, restored from its newest checkpoint.
        committer: persists batches of Readys.
        send: hands a message to the transport without blocking; False when refused.
        tick_seconds: wall time of one `Tick`.
        status_reply: builds a `StatusReply` from the core's status and the replica's (the node
            adds peers, protocol, connected links, ...).
        observer: metrics hooks.
        persist_inline: persist on the core task instead of a worker thread (fsync off).
        idle_inline: persist a batch on the core task when it holds at most
            `phalanx.runtime.driver_persist.IDLE_INLINE_READYS` Readys, installs no snapshot and
            the input channel is empty (an idle node: a single client's write). Under load
            the channel is rarely empty and batches are large, so the worker thread keeps
            stepping during the fsync.
        capacity: size of the input channel.
        max_pending_calls: unanswered client calls above which a leader answers new writes
            with RETRY (see `MAX_PENDING_CALLS`).
        propose_batch: steps the core with several client requests at once (Raft's
            `ProposeBatch`); with it, the requests that arrive in one pass over the input
            channel are stepped together at the end of the pass (one log entry, one
            AppendEntries per follower). Without it, each is a `Submit`.
        output_pending: whether messages or replies handed out are still unwritten (the
            transport's and the client port's `has_backlog`). When it says no, an inline
            write does not first yield to the writer tasks (`EARLY_WRITE_CHECKPOINTS`):
            everything already went out directly. None: always assume some is pending.
        after_pass: called at the end of every pass over the input channel and before an
            inline write blocks the loop (the client port's `flush`: the replies of a pass
            leave in one write per connection).
        flush_sends: writes what the transport held (`Transport.flush` with `hold_sends`):
            called after the pass's early messages are released, before any write starts,
            and after a batch's messages.
        lazy: names the early messages that may wait for the next message to their peer or
            the next tick (`phalanx.runtime.driver_output`; a Raft leader's commit notices).
        idle_stride: ticks per wake-up while the node is quiet (`phalanx.runtime.driver_ticks`;
            1: every tick wakes the node; capped to `MAX_IDLE_STRIDE`).
        supersedes: ``supersedes(new, held)``: whether `new` makes the lazy message `held`
            for the same peer useless; `held` is then dropped (`phalanx.runtime.driver_output`).
        fresh_clock: the core compares `Tick.now_ms` with deadlines (`ProtocolSpec.deadline_clock`).
        wall_clock: the clock `Tick.now_ms` reads, ms since the epoch (tests: a fake one).
    """

    def __init__(
        self,
        *,
        core: Core,
        replica: Replica,
        committer: GroupCommitter,
        send: Callable[[NodeId, Message], bool],
        tick_seconds: float,
        status_reply: Callable[[int, CoreStatus, Replica], StatusReply],
        observer: DriverObserver | None = None,
        persist_inline: bool = False,
        idle_inline: bool = False,
        capacity: int = 4096,
        propose_batch: Callable[[tuple[ClientRequest, ...]], Ready] | None = None,
        max_pending_calls: int = MAX_PENDING_CALLS,
        trace: PhaseTrace | None = None,
        output_pending: Callable[[], bool] | None = None,
        after_pass: Callable[[], None] | None = None,
        flush_sends: Callable[[], None] | None = None,
        lazy: Callable[[Message], bool] | None = None,
        supersedes: Callable[[Message, Message], bool] | None = None,
        idle_stride: int = 1,
        fresh_clock: bool = False,
        wall_clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        if tick_seconds <= 0:
            raise ValueError(f"tick_seconds must be > 0, got {tick_seconds}")
        if max_pending_calls < 1:
            raise ValueError(f"max_pending_calls must be >= 1, got {max_pending_calls}")
        self._max_pending_calls = max_pending_calls
        self.core = core
        self.replica = replica
        self.committer = committer
        self._send = send
        self._trace = trace
        if trace is not None:
            def traced_send(to: NodeId, message: Message) -> bool:
                trace.mark("send", type(message).__name__)
                return send(to, message)

            self._send = traced_send
        self._tick_seconds = tick_seconds
        self._init_pacing(tick_seconds, idle_stride, wall_clock)
        self.fresh_clock = FreshClock(tick_seconds, wall_clock) if fresh_clock else None
        self._tick_due = False
        self._ticks_seen = 0
        self._status_reply = status_reply
        self._observer = observer
        self._persist_inline = persist_inline
        self._idle_inline = idle_inline
        self._unsent_output = False
        self._output_pending = output_pending or (lambda: True)
        self._after_pass = after_pass or (lambda: None)
        self._just_yielded = False
        self._flush_again = False
        self._propose_batch = propose_batch
        self._proposals: list[ClientRequest] = []
        self._proposal_bytes = 0
        self._tx, self._rx = trio.open_memory_channel[_Item](capacity)
        self._inline_start: float | None = None
        """When the open inline pass began (`InlineSteps`); None: none is open."""
        self._pending: list[Ready] = []
        self._inflight: Sequence[Ready] | None = None
        self._inflight_snapshot = False
        self._internal: list[Input] = []
        self._reads: list[ReadState] = []
        self._ticks = 0
        self._storage_error: str | None = None
        self._retry_at = 0
        self._retrying = False
        self._was_leader = False
        self._leader: NodeId | None = None
        self._status = core.status()
        self._nursery: trio.Nursery | None = None
        self.stats = DriverStatistics()
        self.node_id = core.node_id
        self._waiters = ClientWaiters(core.node_id, self.stats)
        self._answer = self._waiters.answer
        self._output = PeerOutput(self._send, flush=flush_sends, lazy=lazy,
                                  supersedes=supersedes, stats=self.stats)
        self._flush_sends = self._output.flush

    # ---------------------------------------------------------------------- public (any task)

    async def call(self, call: ClientCall, target: ReplyTarget) -> None:
        """A client's call; the answer goes to `target.deliver`."""
        await self._put(CallInput(call, target))

    async def calls(self, calls: Sequence[ClientCall], target: ReplyTarget) -> None:
        """Several calls of one connection, in order, as ONE item of the input channel: the
        client port hands over every call decoded from one read, so they reach the core in
        one pass and their writes become one proposal (one entry, one AppendEntries)."""
        if calls and not self._calls_inline(CallsInput(calls, target)):
            await self._put(CallsInput(calls, target))

    async def request_status(self, nonce: int, target: ReplyTarget) -> None:
        await self._put(StatusInput(nonce, target))

    async def control(self, inp: object) -> None:
        """An operator's input for the core itself (`phalanx.runtime.admin_ops`: Raft's
        `ProposeConfChange`, `TransferLeadership`), stepped in channel order."""
        await self._put(inp)  # type: ignore[arg-type]  # the protocol's own input type

    def disconnected(self, target: ReplyTarget) -> None:
        """Forget `target`'s waiters (its connection closed); never blocks."""
        # A full channel: its waiters are dropped when answered (`deliver` no-ops then).
        with contextlib.suppress(trio.WouldBlock, trio.ClosedResourceError):
            self._tx.send_nowait(DisconnectInput(target))

    def subscribe(self, client_id: str, target: ReplyTarget) -> None:
        """Answers for `client_id` (and its lanes) executed here with no waiter go to
        `target` (`ClientWaiters.subscribe`: a PBFT client sends a request to the primary
        alone, and the backups answer it unasked); never blocks."""
        self._waiters.subscribe(client_id, target)

    def status(self) -> CoreStatus:
        """The core's status as of the last step (read-only; safe from any task)."""
        return self._status

    def status_reply(self, nonce: int = 0) -> StatusReply:
        """The node's `StatusReply` as of the last tick."""
        return self._status_reply(nonce, self._status, self.replica)

    @property
    def applied_index(self) -> int:
        return self.replica.applied_index

    @property
    def storage_error(self) -> str | None:
        """Why storage is unavailable (what clients are told), or None while it works."""
        return self._storage_error

    @property
    def busy(self) -> bool:
        """A batch is on the worker thread."""
        return self._inflight is not None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the ticker and the core loop until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._ticker)
            task_status.started()
            await self._core_loop()

    def flush_on_shutdown(self) -> None:
        """After `run` ended: write a deferred commit-only hard state (clean shutdown)."""
        if self._inflight is None:
            self.committer.flush_commit()

    # ---------------------------------------------------------------------- tasks

    async def _core_loop(self) -> None:
        rx = self._rx
        clock = time.perf_counter
        while True:
            if self._flush_again:  # `_flush` deferred an inline write: let writers run
                self._flush_again = False
                for _ in range(EARLY_WRITE_CHECKPOINTS):
                    await trio.lowlevel.checkpoint()
                self._unsent_output = False
                self._just_yielded = True
                start = clock()
            else:
                item = await rx.receive()
                start = clock()
                self._just_yielded = False
                self._handle(item)
            for _ in range(DRAIN_LIMIT):
                try:
                    item = rx.receive_nowait()
                except trio.WouldBlock:
                    break
                self._handle(item)
            self._end_pass(start)

    def _end_pass(self, start: float) -> None:
        """The end of a pass (the core loop's, or an inline one: `InlineSteps`)."""
        self._inline_start = None  # an open inline pass ends with this one
        if self._tick_due:
            self._tick_due = False
            self._on_tick()
        if self._proposals:
            if self._storage_error is None:
                self._propose()
            else:  # their waiters were answered when the storage failed
                self._proposals, self._proposal_bytes = [], 0
        self._flush()
        self._after_pass()
        self._release_early()
        self._flush_sends()
        if time.perf_counter() - start > SLOW_PASS_TICKS * self._tick_seconds:
            self.stats.slow_passes += 1

    def _queued_inputs(self) -> int:
        return self._rx.statistics().current_buffer_used

    async def _post(self, item: _Item) -> None:
        await self._tx.send(item)

    async def _put(self, item: _Item) -> None:
        """Queue `item` for the core loop; yields only while the channel is full (the
        callers yield elsewhere: a socket read, a timer wait), so a message costs one
        scheduler pass fewer than `MemorySendChannel.send`."""
        try:
            self._tx.send_nowait(item)
        except trio.WouldBlock:
            await self._tx.send(item)

    # ---------------------------------------------------------------------- the core task

    def _handle(self, item: _Item) -> None:
        if isinstance(item, _Wake):  # after an inline pass: `_end_pass` does what is left
            return
        fresh = self.fresh_clock
        if fresh is not None and type(item) is not Tick and (tick := fresh.stale_tick()):
            self._handle(tick)  # a stale reading (a pause): the time first
        if self._storage_error is not None and not isinstance(item, _BatchDone | StatusInput):
            self._while_unavailable(item)
            return
        match item:
            case _BatchDone(batch=batch, error=error):
                if self._trace is not None:
                    self._trace.mark("io_end", str(len(batch)))
                self._retrying = False
                if error is not None:
                    if not is_storage_failure(error):
                        logger.critical("%s: persistence failed, stopping: %s", self.node_id,
                                        error)
                        raise error
                    self._storage_failed(batch, error)
                    return
                if self._storage_error is not None:
                    logger.warning("%s: storage is writable again; resuming", self.node_id)
                    self._storage_error = None
                self._inflight = None
                self._inflight_snapshot = False
                self._complete(batch)
            case CallInput(call=call, target=target):
                self._wake_ticks()
                self._on_call(call, target)
            case CallsInput(calls=calls, target=target):
                self._wake_ticks()
                for one in calls:
                    self._on_call(one, target)
            case StatusInput(nonce=nonce, target=target):
                target.deliver(self._status_reply(nonce, self._status, self.replica))
            case DisconnectInput(target=target):
                self._waiters.forget(target)
            case Tick():
                if self.fresh_clock is not None:
                    self.fresh_clock.stepped(item)
                self._ticks += 1
                if self._output.release_lazy():
                    self._unsent_output = True
                if self._trace is not None:
                    self._trace_tick(item, self._trace)
                else:
                    self._step(item)
                self._tick_due = True  # `_on_tick` once, at the end of the pass
            case _:
                if self._trace is not None and isinstance(item, Receive):
                    self._trace.mark("recv", type(item.message).__name__)
                self._step(item)

    def _trace_tick(self, tick: Tick, trace: PhaseTrace) -> None:
        """A traced tick step: marks ``tick_work`` when the tick itself made progress."""
        before = len(self._pending)
        self._step(tick)
        pending = self._pending[before:]
        if any(r.messages or r.committed or r.has_persistence for r in pending):
            trace.mark("tick_work", str(len(pending)))

    def _step(self, inp: Input) -> None:
        self._queue(self.core.step(inp))
        while self._internal:
            internal, self._internal = self._internal, []
            for follow in internal:
                self._queue(self.core.step(follow))

    def _queue(self, ready: Ready) -> None:
        """Hold a Ready's early messages for `_release_early` (step 0); queue the rest in
        step order."""
        self.stats.steps += 1
        if ready.early_messages:
            self._output.hold_early(ready.early_messages)
        if not ready.is_empty and not (
                ready.early_messages and _only_early(ready)):
            self._pending.append(ready)

    def _release_early(self) -> None:
        """Hand the early messages held so far to the transport, in step order.

        Held, not sent at step time: within a pass, the client replies go out first
        (`after_pass`), then the early messages (a leader's commit notices wake both
        followers, which on a small machine then compete for the cores with the reply's
        last hop and the client's next request); lazy ones wait longer (`PeerOutput`).
        Before any persistence starts, the pass releases them (`phalanx.runtime.driver_persist`):
        a leader's AppendEntries still leave before its own write. Sending an early message
        later than it was produced is always allowed (`Ready.early_messages`: they may be
        sent at any point).
        """
        if self._output.release_early():
            self._unsent_output = True

    def _on_tick(self) -> None:
        """Once per pass that stepped ticks (one or a stride's worth)."""
        crossed = self._ticks // COMMIT_FLUSH_TICKS != self._ticks_seen // COMMIT_FLUSH_TICKS
        self._ticks_seen = self._ticks
        previous, status = self._status, self.core.status()
        self._status = status
        is_leader = status.role == "leader"
        if status.leader != self._leader or status.role != previous.role:
            logger.info("%s: %s in term %d, leader %s", self.node_id, status.role, status.term,
                        status.leader or "unknown")
        if status.leader != self._leader:
            self._leader = status.leader
            self.stats.leader_changes += 1
        if self._was_leader and not is_leader:
            self._fail_waiters("leadership lost")
        self._was_leader = is_leader
        if self._observer is not None:
            self._observer.on_status(status, self.replica.applied_index)
        if self._inflight is None:
            self.replica.maintain()
            taken = self.replica.poll()
            if taken:
                self._internal.extend(taken)
                self._step_internal()
            if crossed and self.committer.flush_commit_due():
                self._start_io([], flush_commit=True)
        # Only what a tick can move on counts: a persisting batch ends by its own input.
        self._pace(bool(len(self._waiters) or self._proposals or self._output.lazy_held))

    def _step_internal(self) -> None:
        internal, self._internal = self._internal, []
        for inp in internal:
            self._step(inp)


def _only_early(ready: Ready) -> bool:
    """Whether nothing of `ready` is left once its early messages are sent."""
    return not (ready.has_persistence or ready.messages or ready.committed or ready.reads
                or ready.rejected or ready.aborted or ready.number)
