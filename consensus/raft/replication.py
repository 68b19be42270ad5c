"""Log replication for the Raft core: AppendEntries and InstallSnapshot on both sides (§3.5,
§5.3), flow control through `Progress`, and the commit rule (§3.6.2).

Owns: `Replication`: the leader's per-follower `Progress` (`prs`, tracking the configuration
in `sync_progress`), its sending (batching, pipelining, probing, chunked snapshots) and the
commit rule (`maybe_commit`); the follower's consistency check, conflict truncation and
snapshot reassembly (`SnapshotReassembly`). Log updates go through `LogState`.

Snapshot transfer (docs/RELIABILITY.md): the leader pins the snapshot it
started sending a follower (`Progress.snapshot`; a newer checkpoint does not replace it) and
sends it as a window of `snapshot_chunk_size` chunks, at most `snapshot_window_bytes` beyond
the offset the follower acknowledged (one chunk until the follower's first answer says
where it is, so a follower holding a prefix resumes there). Answers carry the follower's
next offset; only a heartbeat-counted timeout (`Progress.snapshot_heartbeat`) resends, from
the acknowledged offset, never from zero. The follower keeps one growing buffer per
snapshot (leader term, index, term) and never drops a valid prefix on a retransmission.

Invariants:
- It never changes `role`, `term` or `vote`. What it needs from other sub-machines is two
  hooks the core sets: `after_commit` (membership) and `ack_read` (ReadIndex rounds).
- `prs` is empty unless leader; then it holds exactly the members of `config` other than
  us, in sorted order.
- A follower truncates its log only at a real term conflict, never a matching suffix: a
  stale, reordered AppendEntries whose entries all match changes nothing (Ref: §3.5).
- The leader's own acknowledgement is `durable` (what `Persisted` confirmed), never its
  in-memory last index.
- Peer input is dropped and counted (`RaftState.drop`), never raised on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from phalanx.consensus._fastpath import slot_twin
from phalanx.consensus.core import Send, Snapshot
from phalanx.consensus.quorum import INFINITE_INDEX, JointConfig
from phalanx.consensus.raft.bugs import RaftBugs
from phalanx.consensus.raft.logstate import LogState
from phalanx.consensus.raft.messages import (
    AppendEntries,
    AppendEntriesResponse,
    HeartbeatResponse,
    InstallSnapshot,
    InstallSnapshotResponse,
    TimeoutNow,
)
from phalanx.consensus.raft.progress import Progress, ProgressState, stall_limit
from phalanx.consensus.raft.state import RaftState, Role
from phalanx.consensus.types import (
    Entry,
    LocalProtocolError,
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
_LEADER = Role.LEADER


def _unwired(*args: object) -> None:
    raise LocalProtocolError("Replication hook not wired (RaftCore sets it)")


class Replication:
    """Log replication: the leader's `prs` and sending, the follower's checks."""

    __slots__ = ("_bug_learners", "_bug_minority", "_bug_truncate", "_id", "_ls", "_st",
                 "_stall_limit", "ack_read", "after_commit", "cfg", "prs", "quorum_changed",
                 "snap_recv")

    def __init__(self, st: RaftState, ls: LogState, bugs: RaftBugs) -> None:
        self._st = st
        self._ls = ls
        self.cfg = cfg = st.cfg
        self._id = st.id
        self._stall_limit = stall_limit(cfg.election_ticks, cfg.heartbeat_ticks)
        self._bug_minority = bugs.commit_on_minority
        self._bug_learners = bugs.count_learner_acks
        self._bug_truncate = bugs.truncate_matching_suffix
        self.prs: dict[NodeId, Progress] = {}
        self.quorum_changed = True
        """Leader: the configuration or `prs` changed since the last `maybe_commit`, so an
        acknowledgement at or below `commit` may still advance it (see
        `handle_append_response`)."""
        self.snap_recv: SnapshotReassembly | None = None
        """Follower: the prefix received so far of a snapshot being installed."""
        self.after_commit: Callable[[], None] = _unwired
        """Leader: react to a commit index that just advanced (set by the core)."""
        self.ack_read: Callable[[int, NodeId], None] = _unwired
        """Leader: `node` acknowledged the ReadIndex round `context` (set by the core)."""

    # ------------------------------------------------------------------ progress

    def config_changed(self) -> None:
        """`LogState.on_config`: the configuration in force changed."""
        self.quorum_changed = True
        self.sync_progress()

    def sync_progress(self) -> None:
        """Make `prs` track exactly the members of `config` other than us (sorted)."""
        st = self._st
        if st.role is not _LEADER:
            return
        old = self.prs
        self.prs = prs = {}
        self.quorum_changed = True
        ls = self._ls
        for p in ls.config.members():
            if p != self._id:
                prs[p] = old.get(p) or Progress(
                    next_index=ls.log.last_index() + 1, max_inflight=self.cfg.max_inflight,
                    stall_limit=self._stall_limit)
        if st.lead_transferee is not None and st.lead_transferee not in prs:
            st.lead_transferee = None

    def quorum_active(self) -> bool:
        """Leader (check-quorum, §6.2): a quorum was heard from since the last call."""
        active = [self._id]
        for p, pr in self.prs.items():
            if pr.recent_active:
                active.append(p)
            pr.recent_active = False
        return self._ls.joint.has_quorum(active)

    # ------------------------------------------------------------------ leader: sending

    def broadcast_append(self, *, allow_empty: bool = True) -> None:
        send_append = self.send_append
        for p in self.prs:
            send_append(p, allow_empty=allow_empty)

    def send_append(self, p: NodeId, *, allow_empty: bool) -> bool:
        """Send `p` what flow control allows; True if a message went out."""
        pr = self.prs[p]
        if pr.is_blocked():
            return False
        ls = self._ls
        log = ls.log
        last = log.offset + len(log.entries)  # log.last_index(), inlined on this hot path
        if pr.next > last + 1:
            pr.next = last + 1
        prev = pr.next - 1
        # log.term_at(prev), inlined (prev <= last): None when compacted away.
        k = prev - log.offset
        prev_term = log.entries[k - 1].term if k > 0 else log.offset_term if k == 0 else None
        if prev_term is None:  # compacted: the follower needs a snapshot (Ref: §5.3)
            if ls.snapshot is None:
                raise LocalProtocolError("log compacted without a snapshot to send")
            pr.become_snapshot(ls.snapshot)
            self.send_snapshot_chunks(p, pr)
            return True
        ents: tuple[Entry, ...] = ()
        if pr.next <= last:
            cfg = self.cfg
            ents = log.slice(pr.next, last + 1, max_entries=cfg.max_batch_entries,
                             max_bytes=cfg.max_batch_bytes)
        if not ents and not allow_empty:
            return False
        # Only a leader sends entries, and they go out early (`RaftState.send`, §10.2.1).
        # `new_send(p, new_append_entries(term, id, prev, prev_term, ents, commit))`,
        # inlined through the layout twins (`_fastpath.slot_twin`): two calls less per message.
        st = self._st
        msg = _AE_TWIN()
        msg.term = st.term
        msg.leader_id = self._id
        msg.prev_log_index = prev
        msg.prev_log_term = prev_term
        msg.entries = ents
        msg.leader_commit = ls.commit
        msg.__class__ = AppendEntries
        out = _SEND_TWIN()
        out.to = p
        out.message = msg
        out.__class__ = Send
        st.early.append(out)
        pr.sent_entries(prev + len(ents))
        return True

    def send_snapshot_chunks(self, p: NodeId, pr: Progress) -> None:
        """Send `p` the chunks of its pinned snapshot that the window allows."""
        snap = pr.snapshot
        if snap is None:
            raise LocalProtocolError("no snapshot to send")
        data = snap.data
        total = len(data)
        meta = snap.meta
        cs = self.cfg.snapshot_chunk_size
        limit = self.cfg.snapshot_window_bytes if pr.snapshot_known else cs
        st = self._st
        while not pr.snapshot_last_out:
            off = pr.snapshot_sent
            n = min(cs, total - off)
            outstanding = off - pr.snapshot_offset
            if outstanding > 0 and outstanding + n > limit:
                return  # the window is full
            done = off + n >= total
            st.send(p, InstallSnapshot(
                term=st.term, leader_id=self._id, last_included_index=meta.index,
                last_included_term=meta.term, config=meta.config, offset=off,
                data=data[off: off + n], done=done))
            pr.snapshot_sent = off + n
            pr.snapshot_last_out = done

    # ------------------------------------------------------------------ leader: responses

    def maybe_commit(self) -> bool:
        """Leader: advance `commit` to what a quorum acknowledged (True if it moved)."""
        self.quorum_changed = False
        ls = self._ls
        acked = {p: pr.match for p, pr in self.prs.items()}
        acked[self._id] = ls.durable
        joint = ls.joint
        if self._bug_minority:
            idx = _minority_committed(joint, acked)
        elif self._bug_learners:
            idx = _learners_committed(joint, acked)
        elif not joint.outgoing.voters:  # not joint: `joint.committed_index`, one call less
            idx = joint.incoming.committed_index(acked)
            if idx == INFINITE_INDEX:
                idx = 0
        else:
            idx = joint.committed_index(acked)
        # Ref: §3.6.2 (Figure 3.7): only entries of the current term commit by counting.
        if idx > ls.commit and ls.log.term_at(idx) == self._st.term:
            ls.commit = idx
            return True
        return False

    def handle_append_response(self, p: NodeId, pr: Progress, m: AppendEntriesResponse) -> None:
        ls = self._ls
        log = ls.log
        last = log.offset + len(log.entries)  # log.last_index(), inlined on this hot path
        if m.success:
            if m.match_index > last:
                self._st.drop("match_beyond_log")
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
            # value <= commit leaves it where the last `maybe_commit` found it (it has run
            # after every other change it depends on: `durable` in the core's `_persisted`,
            # the configuration and `prs` through `quorum_changed`).
            if (pr.match > ls.commit or self.quorum_changed) and self.maybe_commit():
                self.after_commit()
            if p not in self.prs:
                return  # the commit removed it (or us) from the configuration
            last = log.offset + len(log.entries)  # (the commit may have appended entries)
            send_append = self.send_append
            while pr.next <= last and send_append(p, allow_empty=False):
                pass  # Ref: §10.2.1 pipelining within the inflight window
            st = self._st
            if p == st.lead_transferee and pr.match == last:
                st.send(p, TimeoutNow(term=st.term, leader_id=self._id))  # Ref: §3.10
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
            k = log.last_index_of_term(m.conflict_term, at_most=m.reject_index)
            nxt = k + 1 if k > 0 else m.conflict_index
        else:
            nxt = m.conflict_index
        nxt = max(pr.match + 1, min(nxt, m.reject_index))
        pr.become_probe()
        pr.next = nxt
        self.send_append(p, allow_empty=True)

    def handle_heartbeat_response(self, p: NodeId, pr: Progress, m: HeartbeatResponse) -> None:
        if 0 < m.lost_from <= pr.match and pr.state is not ProgressState.SNAPSHOT:
            # The follower lost entries it acknowledged: lower its match (our commit stays:
            # it only grows) and probe from its log end.
            pr.forget_after(m.lost_from - 1)
        if pr.state is ProgressState.SNAPSHOT:
            if pr.snapshot_heartbeat():  # the timeout: resend from the acknowledged offset
                self.send_snapshot_chunks(p, pr)
        else:
            log = self._ls.log
            last = log.offset + len(log.entries)  # log.last_index(), inlined
            stalled = pr.heartbeat_acked(last)  # counted in PROBE too: it teaches the lag
            if pr.state is ProgressState.PROBE:
                pr.paused = False
            elif stalled:
                pr.become_probe()  # the window probably holds lost messages: probe again
            if pr.match < last:
                self.send_append(p, allow_empty=pr.state is ProgressState.PROBE)
        if m.context:
            self.ack_read(m.context, p)

    def handle_snapshot_response(self, p: NodeId, pr: Progress,
                                 m: InstallSnapshotResponse) -> None:
        snap = pr.snapshot
        if (pr.state is not ProgressState.SNAPSHOT or snap is None
                or m.last_included_index != pr.snapshot_index):
            self._st.drop("stale_snapshot_response")
            return
        if m.done:
            pr.match = max(pr.match, m.last_included_index)
            pr.become_probe()
            if self.maybe_commit():
                self.after_commit()
            if p in self.prs:
                self.send_append(p, allow_empty=True)
            return
        if m.next_offset > len(snap.data):
            self._st.drop("malformed")
            return
        if pr.snapshot_acked(m.next_offset):
            self.send_snapshot_chunks(p, pr)

    # ------------------------------------------------------------------ follower

    def handle_append_entries(self, src: NodeId, m: AppendEntries) -> None:
        ls = self._ls
        log = ls.log
        st = self._st
        prev, prev_term, ents = m.prev_log_index, m.prev_log_term, m.entries
        commit = ls.commit
        if prev < commit:
            # Our prefix up to commit equals every leader's (Leader Completeness): check the
            # rest against our commit point instead of an index we may have compacted.
            ents = tuple(e for e in ents if e.index > commit)
            prev = commit
            prev_term = log.term_at(prev) or 0
        offset = log.offset
        last = offset + len(log.entries)  # log.last_index(), inlined on this hot path
        if prev > last:
            st.send(src, AppendEntriesResponse(
                term=st.term, success=False, reject_index=m.prev_log_index,
                conflict_index=last + 1, conflict_term=0))
            return
        # log.match_term(prev, prev_term), inlined (offset <= commit <= prev <= last here).
        if (log.entries[prev - offset - 1].term if prev > offset else log.offset_term) != prev_term:
            st.send(src, AppendEntriesResponse(
                term=st.term, success=False, reject_index=m.prev_log_index,
                conflict_index=log.first_index_of_term(prev),
                conflict_term=log.term_at(prev) or 0))
            return
        if self._bug_truncate and ents and ents[0].index <= last:
            # BUG (test-only): overwrite everything after prev, even a matching suffix.
            ls.truncate_from(ents[0].index)
            ls.append(list(ents))
        elif ents:
            ci = log.find_conflict(ents)  # Ref: §3.5: truncate only at a real conflict
            if ci:
                if ci <= ls.commit:
                    st.drop("conflict_below_commit")
                    return
                if ci <= last:
                    ls.truncate_from(ci)
                ls.append(list(ents[ci - ents[0].index:]))
        match = prev + len(ents)
        commit = m.leader_commit if m.leader_commit < match else match
        if commit > ls.commit:  # commit_to, inlined
            ls.commit = commit
        # A follower's answer waits for its Ready to be persisted (`RaftState.send`).
        # `new_send(src, new_append_entries_response(term, True, match, 0, 0, 0))`, inlined
        # as in `send_append`.
        msg = _AER_TWIN()
        msg.term = st.term
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
        st.msgs.append(out)

    def handle_install_snapshot(self, src: NodeId, m: InstallSnapshot) -> None:
        ls = self._ls
        st = self._st
        idx = m.last_included_index
        if idx <= ls.commit:
            st.send(src, InstallSnapshotResponse(term=st.term, last_included_index=idx,
                                                 next_offset=0, done=True))
            return
        key = (st.term, idx, m.last_included_term)
        rec = self.snap_recv
        if rec is None or rec.key != key:
            if m.offset != 0:
                st.send(src, InstallSnapshotResponse(term=st.term, last_included_index=idx,
                                                     next_offset=0, done=False))
                return
            rec = self.snap_recv = SnapshotReassembly(key)
        buf = rec.buf
        got = len(buf)
        end = m.offset + len(m.data)
        if not m.offset <= got <= end:
            # After a gap (a chunk was lost) or a duplicate of what we hold: keep the prefix
            # and say where we are (the leader resends only after its timeout).
            st.send(src, InstallSnapshotResponse(term=st.term, last_included_index=idx,
                                                 next_offset=got, done=False))
            return
        if end > got:
            buf += memoryview(m.data)[got - m.offset:]
        received = len(buf)
        if not m.done:
            st.send(src, InstallSnapshotResponse(term=st.term, last_included_index=idx,
                                                 next_offset=received, done=False))
            return
        self.snap_recv = None
        if ls.log.match_term(idx, m.last_included_term):
            # Ref: §5.3 (Figure 5.3, step 6): our log already holds it; keep what follows.
            ls.commit_to(idx)
        else:
            meta = SnapshotMeta(index=idx, term=m.last_included_term, config=m.config)
            data = bytes(buf)
            del buf, rec  # (the buffer goes now: one more copy only while `bytes` copies it)
            ls.install_snapshot(Snapshot(meta=meta, data=data))
        st.send(src, InstallSnapshotResponse(term=st.term, last_included_index=idx,
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


def _learners_committed(joint: JointConfig, acked: Mapping[NodeId, int]) -> int:
    """BUG (test-only, ``count_learner_acks``): a quorum as large as the incoming voters'
    majority, filled from every member's acknowledgement (learners' too)."""
    if not joint.incoming.voters:
        return 0
    idx = sorted(acked.values(), reverse=True)
    return idx[min(len(idx), len(joint.incoming.voters) // 2 + 1) - 1]
