"""Log replication for the Raft core: AppendEntries and InstallSnapshot on both sides (§3.5,
§5.3), flow control through `Progress`, and the commit rule (§3.6.2).

Owns: the leader's sending (batching, pipelining, probing, chunked snapshots), the
follower's consistency check, conflict truncation and snapshot reassembly, and local log
updates (`_append_local`, `_truncate_log`, `_install_snapshot`) that also record what the
`Ready` must persist.

Snapshot transfer (docs/RELIABILITY.md): the leader pins the snapshot it
started sending a follower (`Progress.snapshot`; a newer checkpoint does not replace it) and
sends it as a window of `snapshot_chunk_size` chunks, at most `snapshot_window_bytes` beyond
the offset the follower acknowledged (one chunk until the follower's first answer says
where it is, so a follower holding a prefix resumes there). Answers carry the follower's
next offset; only a heartbeat-counted timeout (`Progress.snapshot_heartbeat`) resends, from
the acknowledged offset, never from zero. The follower keeps one growing buffer per
snapshot (leader term, index, term) and never drops a valid prefix on a retransmission.

Rules:
- A base class of `RaftCore` (core.py), split out to keep files cohesive. It never changes
  `role` or `term`; the two hooks it needs from the core are abstract methods.
- A follower truncates its log only at a real term conflict, never a matching suffix: a
  stale, reordered AppendEntries whose entries all match changes nothing (Ref: §3.5).
- The leader's own acknowledgement is `durable` (what `Persisted` confirmed), never its
  in-memory last index.
- Peer input is dropped and counted (`_drop`), never raised on.
"""

from __future__ import annotations

import abc
from collections import deque
from collections.abc import Mapping

from phalanx.consensus._fastpath import new_send, slot_twin
from phalanx.consensus.core import Send, Snapshot
from phalanx.consensus.quorum import INFINITE_INDEX, JointConfig
from phalanx.consensus.raft.config import RaftConfig
from phalanx.consensus.raft.log import RaftLog
from phalanx.consensus.raft.messages import (
    AppendEntries,
    AppendEntriesResponse,
    HeartbeatResponse,
    InstallSnapshot,
    InstallSnapshotResponse,
    TimeoutNow,
)
from phalanx.consensus.raft.progress import Progress, ProgressState
from phalanx.consensus.types import (
    Configuration,
    Entry,
    EntryKind,
    LocalProtocolError,
    Message,
    NodeId,
    SnapshotMeta,
)


class SnapshotReassembly:
    """Follower: the prefix received so far of one snapshot, identified by `key` = (leader
    term, last included index, last included term). One buffer, grown in place."""

    __slots__ = ("buf", "key")

    def __init__(self, key: tuple[int, int, int]) -> None:
        self.key = key
        self.buf = bytearray()


_SEND_TWIN = slot_twin(Send)
_AE_TWIN = slot_twin(AppendEntries)
_AER_TWIN = slot_twin(AppendEntriesResponse)
_INF = 1 << 62
_CONFIG = EntryKind.CONFIG


class Replication(abc.ABC):
    """Replication half of `RaftCore` (state is declared here, initialised by the core)."""

    cfg: RaftConfig
    id: NodeId
    log: RaftLog
    term: int
    commit: int
    applied: int
    durable: int
    prs: dict[NodeId, Progress]
    snapshot: Snapshot | None
    lead_transferee: NodeId | None
    dropped: dict[str, int]
    _msgs: list[Send]
    _early: list[Send]
    _new_entries: list[Entry]
    _truncate: int | None
    _snap_out: Snapshot | None
    _pending_durable: deque[tuple[int, int]]
    _snap_recv: SnapshotReassembly | None
    _config: Configuration
    joint: JointConfig
    """`JointConfig.of(config)`, kept in step with `config` (the quorum math of every
    commit, vote and ReadIndex check; rebuilt only when the configuration changes)."""
    _quorum_changed: bool
    """Leader: the configuration or `prs` changed since the last `_maybe_commit`, so an
    acknowledgement at or below `commit` may still advance it (see `_handle_append_response`)."""

    @property
    def config(self) -> Configuration:
        """The configuration in force (the latest one in the log, Ref: §4.1)."""
        return self._config

    @config.setter
    def config(self, value: Configuration) -> None:
        self._config = value
        self.joint = JointConfig.of(value)
        self._quorum_changed = True

    @abc.abstractmethod
    def _sync_progress(self) -> None:
        """Leader: make `prs` match `config` (the core owns roles)."""

    @abc.abstractmethod
    def _after_commit(self) -> None:
        """Leader: react to a commit index that just advanced."""

    @abc.abstractmethod
    def _ack_read(self, context: int, node: NodeId) -> None:
        """Leader: `node` acknowledged the ReadIndex round `context`."""

    def _send(self, to: NodeId, message: Message) -> None:
        self._msgs.append(new_send(to, message))

    def _drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    # ------------------------------------------------------------------ local log updates

    def _append_local(self, entries: list[Entry]) -> None:
        self.log.append(entries)
        self._new_entries.extend(entries)
        for e in entries:  # (a loop, not `any(...)`: no generator on this hot path)
            if e.kind is _CONFIG:
                self.config = self.log.latest_config()[1]  # Ref: §4.1: in force once appended
                self._sync_progress()
                break

    def _truncate_log(self, index: int) -> None:
        if index <= self.commit:
            raise LocalProtocolError(f"truncating committed index {index} (commit {self.commit})")
        had_config = bool(self.log.configs) and self.log.configs[-1][0] >= index
        self.log.truncate_from(index)
        self._new_entries = [e for e in self._new_entries if e.index < index]
        self._truncate = index if self._truncate is None else min(self._truncate, index)
        self.durable = min(self.durable, index - 1)
        self._pending_durable = deque((n, min(i, index - 1)) for n, i in self._pending_durable)
        if had_config:
            self.config = self.log.latest_config()[1]
            self._sync_progress()

    def _install_snapshot(self, snap: Snapshot) -> None:
        meta = snap.meta
        self.log.restore(index=meta.index, term=meta.term, config=meta.config)
        self._snap_out = snap
        self.snapshot = snap
        self.commit = max(self.commit, meta.index)
        self.applied = meta.index
        self._new_entries = []
        self._truncate = None
        self.durable = min(self.durable, meta.index)
        self._pending_durable = deque((n, min(i, meta.index)) for n, i in self._pending_durable)
        self.config = meta.config
        self._sync_progress()

    def _commit_to(self, index: int) -> None:
        if index > self.commit:
            self.commit = index

    # ------------------------------------------------------------------ leader: sending

    def _broadcast_append(self, *, allow_empty: bool = True) -> None:
        for p in self.prs:
            self._send_append(p, allow_empty=allow_empty)

    def _send_append(self, p: NodeId, *, allow_empty: bool) -> bool:
        """Send `p` what flow control allows; True if a message went out."""
        pr = self.prs[p]
        if pr.is_blocked():
            return False
        log = self.log
        last = log.offset + len(log.entries)  # log.last_index(), inlined on this hot path
        if pr.next > last + 1:
            pr.next = last + 1
        prev = pr.next - 1
        # log.term_at(prev), inlined (prev <= last): None when compacted away.
        k = prev - log.offset
        prev_term = log.entries[k - 1].term if k > 0 else log.offset_term if k == 0 else None
        if prev_term is None:  # compacted: the follower needs a snapshot (Ref: §5.3)
            if self.snapshot is None:
                raise LocalProtocolError("log compacted without a snapshot to send")
            pr.become_snapshot(self.snapshot)
            self._send_snapshot_chunks(p, pr)
            return True
        ents: tuple[Entry, ...] = ()
        if pr.next <= last:
            ents = log.slice(pr.next, last + 1, max_entries=self.cfg.max_batch_entries,
                                  max_bytes=self.cfg.max_batch_bytes)
        if not ents and not allow_empty:
            return False
        # Only a leader sends entries, and they go out early (`RaftCore._send`, §10.2.1).
        # `new_send(p, new_append_entries(term, id, prev, prev_term, ents, commit))`,
        # inlined through the layout twins (`types.slot_twin`): two calls less per message.
        msg = _AE_TWIN()
        msg.term = self.term
        msg.leader_id = self.id
        msg.prev_log_index = prev
        msg.prev_log_term = prev_term
        msg.entries = ents
        msg.leader_commit = self.commit
        msg.__class__ = AppendEntries
        out = _SEND_TWIN()
        out.to = p
        out.message = msg
        out.__class__ = Send
        self._early.append(out)
        pr.sent_entries(prev + len(ents))
        return True

    def _send_snapshot_chunks(self, p: NodeId, pr: Progress) -> None:
        """Send `p` the chunks of its pinned snapshot that the window allows."""
        snap = pr.snapshot
        if snap is None:
            raise LocalProtocolError("no snapshot to send")
        data = snap.data
        total = len(data)
        meta = snap.meta
        cs = self.cfg.snapshot_chunk_size
        limit = self.cfg.snapshot_window_bytes if pr.snapshot_known else cs
        while not pr.snapshot_last_out:
            off = pr.snapshot_sent
            n = min(cs, total - off)
            outstanding = off - pr.snapshot_offset
            if outstanding > 0 and outstanding + n > limit:
                return  # the window is full
            done = off + n >= total
            self._send(p, InstallSnapshot(
                term=self.term, leader_id=self.id, last_included_index=meta.index,
                last_included_term=meta.term, config=meta.config, offset=off,
                data=data[off: off + n], done=done))
            pr.snapshot_sent = off + n
            pr.snapshot_last_out = done

    # ------------------------------------------------------------------ leader: responses

    def _maybe_commit(self) -> bool:
        self._quorum_changed = False
        acked = {p: pr.match for p, pr in self.prs.items()}
        acked[self.id] = self.durable
        joint = self.joint
        if "commit_on_minority" in self.cfg.bugs:
            idx = _minority_committed(joint, acked)
        elif not joint.outgoing.voters:  # not joint: `joint.committed_index`, one call less
            idx = joint.incoming.committed_index(acked)
            if idx == INFINITE_INDEX:
                idx = 0
        else:
            idx = joint.committed_index(acked)
        # Ref: §3.6.2 (Figure 3.7): only entries of the current term commit by counting.
        if idx > self.commit and self.log.term_at(idx) == self.term:
            self.commit = idx
            return True
        return False

    def _handle_append_response(self, p: NodeId, pr: Progress, m: AppendEntriesResponse) -> None:
        log = self.log
        last = log.offset + len(log.entries)  # log.last_index(), inlined on this hot path
        if m.success:
            if m.match_index > last:
                self._drop("match_beyond_log")
                return
            updated = pr.maybe_update(m.match_index)
            if not updated and not (pr.state is ProgressState.PROBE
                                    and m.match_index == pr.match):
                return  # stale or duplicate
            if pr.state is ProgressState.PROBE:
                pr.become_replicate()
            elif pr.state is ProgressState.SNAPSHOT and pr.match >= pr.snapshot_index:
                pr.become_probe()
            # An acknowledgement at or below `commit` cannot advance it: the quorum index is
            # an order statistic of the acknowledged indexes, and raising one of them to a
            # value <= commit leaves it where the last `_maybe_commit` found it (it has run
            # after every other change it depends on: `durable` in `_persisted`, the
            # configuration and `prs` through `_quorum_changed`).
            if (pr.match > self.commit or self._quorum_changed) and self._maybe_commit():
                self._after_commit()
            if p not in self.prs:
                return  # the commit removed it (or us) from the configuration
            last = log.offset + len(log.entries)  # (the commit may have appended entries)
            while pr.next <= last and self._send_append(p, allow_empty=False):
                pass  # Ref: §10.2.1 pipelining within the inflight window
            if p == self.lead_transferee and pr.match == last:
                self._send(p, TimeoutNow(term=self.term, leader_id=self.id))  # Ref: §3.10
            return
        if m.reject_index == 0 and m.conflict_index == 0:
            return  # a stale-leader notice at our own term: nothing to learn
        if pr.state is ProgressState.SNAPSHOT:
            return
        if pr.state is ProgressState.REPLICATE and m.reject_index <= pr.match:
            return  # stale
        if pr.state is ProgressState.PROBE and m.reject_index != pr.next - 1:
            return  # stale
        # Ref: §5.3 fast backtracking with the conflict term / first index hints.
        if m.conflict_term > 0:
            k = self.log.last_index_of_term(m.conflict_term, at_most=m.reject_index)
            nxt = k + 1 if k > 0 else m.conflict_index
        else:
            nxt = m.conflict_index
        nxt = max(pr.match + 1, min(nxt, m.reject_index))
        pr.become_probe()
        pr.next = nxt
        self._send_append(p, allow_empty=True)

    def _handle_heartbeat_response(self, p: NodeId, pr: Progress, m: HeartbeatResponse) -> None:
        if 0 < m.lost_from <= pr.match and pr.state is not ProgressState.SNAPSHOT:
            # The follower lost entries it acknowledged: lower its match (our commit stays:
            # it only grows) and probe from its log end.
            pr.forget_after(m.lost_from - 1)
        if pr.state is ProgressState.SNAPSHOT:
            if pr.snapshot_heartbeat():  # the timeout: resend from the acknowledged offset
                self._send_snapshot_chunks(p, pr)
        else:
            log = self.log
            last = log.offset + len(log.entries)  # log.last_index(), inlined
            stalled = pr.heartbeat_acked(last)  # counted in PROBE too: it teaches the lag
            if pr.state is ProgressState.PROBE:
                pr.paused = False
            elif stalled:
                pr.become_probe()  # the window probably holds lost messages: probe again
            if pr.match < last:
                self._send_append(p, allow_empty=pr.state is ProgressState.PROBE)
        if m.context:
            self._ack_read(m.context, p)

    def _handle_snapshot_response(self, p: NodeId, pr: Progress,
                                  m: InstallSnapshotResponse) -> None:
        snap = pr.snapshot
        if (pr.state is not ProgressState.SNAPSHOT or snap is None
                or m.last_included_index != pr.snapshot_index):
            self._drop("stale_snapshot_response")
            return
        if m.done:
            pr.match = max(pr.match, m.last_included_index)
            pr.become_probe()
            if self._maybe_commit():
                self._after_commit()
            if p in self.prs:
                self._send_append(p, allow_empty=True)
            return
        if m.next_offset > len(snap.data):
            self._drop("malformed")
            return
        if pr.snapshot_acked(m.next_offset):
            self._send_snapshot_chunks(p, pr)

    # ------------------------------------------------------------------ follower

    def _handle_append_entries(self, src: NodeId, m: AppendEntries) -> None:
        prev, prev_term, ents = m.prev_log_index, m.prev_log_term, m.entries
        if prev < self.commit:
            # Our prefix up to commit equals every leader's (Leader Completeness): check the
            # rest against our commit point instead of an index we may have compacted.
            ents = tuple(e for e in ents if e.index > self.commit)
            prev = self.commit
            prev_term = self.log.term_at(prev) or 0
        log = self.log
        offset = log.offset
        last = offset + len(log.entries)  # log.last_index(), inlined on this hot path
        if prev > last:
            self._send(src, AppendEntriesResponse(
                term=self.term, success=False, reject_index=m.prev_log_index,
                conflict_index=last + 1, conflict_term=0))
            return
        # log.match_term(prev, prev_term), inlined (offset <= commit <= prev <= last here).
        if (log.entries[prev - offset - 1].term if prev > offset else log.offset_term) != prev_term:
            self._send(src, AppendEntriesResponse(
                term=self.term, success=False, reject_index=m.prev_log_index,
                conflict_index=self.log.first_index_of_term(prev),
                conflict_term=self.log.term_at(prev) or 0))
            return
        if "truncate_matching_suffix" in self.cfg.bugs and ents and ents[0].index <= last:
            # BUG (test-only): overwrite everything after prev, even a matching suffix.
            self._truncate_log(ents[0].index)
            self._append_local(list(ents))
        elif ents:
            ci = self.log.find_conflict(ents)  # Ref: §3.5: truncate only at a real conflict
            if ci:
                if ci <= self.commit:
                    self._drop("conflict_below_commit")
                    return
                if ci <= last:
                    self._truncate_log(ci)
                self._append_local(list(ents[ci - ents[0].index:]))
        match = prev + len(ents)
        commit = m.leader_commit if m.leader_commit < match else match
        if commit > self.commit:  # _commit_to, inlined
            self.commit = commit
        # A follower's answer waits for its Ready to be persisted (`RaftCore._send`).
        # `new_send(src, new_append_entries_response(term, True, match, 0, 0, 0))`, inlined
        # as in `_send_append`.
        msg = _AER_TWIN()
        msg.term = self.term
        msg.success = True
        msg.match_index = match
        msg.reject_index = 0
        msg.conflict_index = 0
        msg.conflict_term = 0
        msg.__class__ = AppendEntriesResponse
        out = _SEND_TWIN()
        out.to = src
        out.message = msg
        out.__class__ = Send
        self._msgs.append(out)

    def _handle_install_snapshot(self, src: NodeId, m: InstallSnapshot) -> None:
        idx = m.last_included_index
        if idx <= self.commit:
            self._send(src, InstallSnapshotResponse(term=self.term, last_included_index=idx,
                                                    next_offset=0, done=True))
            return
        key = (self.term, idx, m.last_included_term)
        rec = self._snap_recv
        if rec is None or rec.key != key:
            if m.offset != 0:
                self._send(src, InstallSnapshotResponse(term=self.term, last_included_index=idx,
                                                        next_offset=0, done=False))
                return
            rec = self._snap_recv = SnapshotReassembly(key)
        buf = rec.buf
        got = len(buf)
        end = m.offset + len(m.data)
        if not m.offset <= got <= end:
            # After a gap (a chunk was lost) or a duplicate of what we hold: keep the prefix
            # and say where we are (the leader resends only after its timeout).
            self._send(src, InstallSnapshotResponse(term=self.term, last_included_index=idx,
                                                    next_offset=got, done=False))
            return
        if end > got:
            buf += memoryview(m.data)[got - m.offset:]
        received = len(buf)
        if not m.done:
            self._send(src, InstallSnapshotResponse(term=self.term, last_included_index=idx,
                                                    next_offset=received, done=False))
            return
        self._snap_recv = None
        if self.log.match_term(idx, m.last_included_term):
            # Ref: §5.3 (Figure 5.3, step 6): our log already holds it; keep what follows.
            self._commit_to(idx)
        else:
            meta = SnapshotMeta(index=idx, term=m.last_included_term, config=m.config)
            data = bytes(buf)
            del buf, rec  # (the buffer goes now: one more copy only while `bytes` copies it)
            self._install_snapshot(Snapshot(meta=meta, data=data))
        self._send(src, InstallSnapshotResponse(term=self.term, last_included_index=idx,
                                                next_offset=received, done=True))


def _minority_committed(joint: JointConfig, acked: Mapping[NodeId, int]) -> int:
    """BUG (test-only, ``commit_on_minority``): the commit rule with an off-by-one quorum."""

    def half(voters: tuple[NodeId, ...]) -> int:
        if not voters:
            return _INF
        idx = sorted((acked.get(v, 0) for v in voters), reverse=True)
        return idx[max(1, len(idx) // 2) - 1]  # should be len // 2 + 1

    r = min(half(joint.incoming.voters), half(joint.outgoing.voters))
    return 0 if r == _INF else r
