"""Membership for the Raft core: joint-consensus changes (§4.3, `confchange.py`), leadership
transfer (§3.10) and the leader's reaction to a new commit index.

Owns: `prs` tracking the configuration (`_sync_progress`), proposing a change, leaving a
joint configuration once it commits, a removed leader stepping down, and TimeoutNow.

Rules:
- A base class of `RaftCore` (core.py) on top of `Election`, split out to keep files
  cohesive. It must not import core.py; what it needs from the core (starting a ReadIndex
  round) is an abstract method.
- Only one change at a time: a new one is refused while the latest configuration is
  uncommitted or joint, and before the leader committed an entry of its term.
- A learner is promoted only once it has caught up with the commit index.
"""

from __future__ import annotations

import abc

from phalanx.consensus.raft import confchange
from phalanx.consensus.raft.election import Election, Role
from phalanx.consensus.raft.messages import TimeoutNow
from phalanx.consensus.raft.progress import Progress, stall_limit
from phalanx.consensus.raft.readonly import ReadOnly
from phalanx.consensus.types import Entry, EntryKind, NodeId


class Membership(Election):
    """Membership part of `RaftCore` (state is declared here, initialised by the core)."""

    readonly: ReadOnly
    conf_change_error: str | None

    @abc.abstractmethod
    def _start_read_round(self) -> None:
        """Leader: start a ReadIndex round for the queued reads."""

    def _sync_progress(self) -> None:
        """Make `prs` track exactly the members of `config` other than us (sorted)."""
        if self.role is not Role.LEADER:
            return
        old = self.prs
        self.prs = {}
        self._quorum_changed = True
        for p in self.config.members():
            if p != self.id:
                self.prs[p] = old.get(p) or Progress(
                    next_index=self.log.last_index() + 1, max_inflight=self.cfg.max_inflight,
                    stall_limit=stall_limit(self.cfg.election_ticks, self.cfg.heartbeat_ticks))
        if self.lead_transferee is not None and self.lead_transferee not in self.prs:
            self.lead_transferee = None

    def _propose_conf_change(self, change: confchange.ConfChange) -> None:
        self.conf_change_error = None
        if self.role is not Role.LEADER:
            self.conf_change_error = "not leader"
            return
        cfg_index, cfg = self.log.latest_config()
        if cfg_index > self.commit or cfg.joint:
            self.conf_change_error = "a membership change is in progress"
            return
        if self.log.term_at(self.commit) != self.term:
            self.conf_change_error = "leader has not committed an entry of its term yet"
            return
        for n in change.add_voters:
            pr = self.prs.get(n)
            if n in cfg.learners and (pr is None or pr.match < self.commit):
                self.conf_change_error = f"learner {n} has not caught up"
                return
        try:
            new = confchange.enter_joint(cfg, change)
        except confchange.ConfChangeError as e:
            self.conf_change_error = str(e)
            return
        self._append_local([Entry(index=self.log.last_index() + 1, term=self.term,
                                  kind=EntryKind.CONFIG, config=new)])
        self._broadcast_append(allow_empty=False)

    def _transfer_leadership(self, to: NodeId) -> None:
        if self.role is not Role.LEADER or to == self.id or to not in self.config.voters:
            return
        self.lead_transferee = to
        self.election_elapsed = 0
        pr = self.prs[to]
        if pr.match == self.log.last_index():
            self._send(to, TimeoutNow(term=self.term, leader_id=self.id))
        else:
            self._send_append(to, allow_empty=False)

    def _after_commit(self) -> None:
        """Leader: propagate a new commit index, finish joint changes, step down if removed."""
        self._broadcast_append()
        cfg_index, cfg = self.log.latest_config()
        if cfg_index <= self.commit:
            if cfg.joint:
                self._append_local([Entry(index=self.log.last_index() + 1, term=self.term,
                                          kind=EntryKind.CONFIG,
                                          config=confchange.leave_joint(cfg))])
                self._broadcast_append(allow_empty=False)
            elif self.id not in cfg.voters:
                self._become_follower(self.term, None)  # Ref: §4.2.2 removing the leader
        if self.readonly.queued and not self.readonly.rounds:
            self._start_read_round()
