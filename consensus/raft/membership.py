"""Membership for the Raft core: joint-consensus changes (§4.3, `confchange.py`), leadership
transfer (§3.10) and the leader's reaction to a new commit index.

Owns: `Membership`: proposing a change (and why the last one was refused,
`conf_change_error`), leaving a joint configuration once it commits, a removed leader
stepping down, and starting a leadership transfer (`RaftState.lead_transferee`; TimeoutNow
goes out once the target has caught up, see `Replication.handle_append_response`).

Invariants:
- Only one change at a time: a new one is refused while the latest configuration is
  uncommitted or joint, and before the leader committed an entry of its term.
- A learner is promoted only once it has caught up with the commit index.
- The one transition it needs (a removed leader steps down) is the `become_follower` hook
  the core passes in.
"""

from __future__ import annotations

from collections.abc import Callable

from phalanx.consensus.raft import confchange
from phalanx.consensus.raft.election import Election
from phalanx.consensus.raft.logstate import LogState
from phalanx.consensus.raft.messages import TimeoutNow
from phalanx.consensus.raft.proposals import Proposals
from phalanx.consensus.raft.replication import Replication
from phalanx.consensus.raft.state import RaftState, Role
from phalanx.consensus.types import Entry, EntryKind, NodeId


class Membership:
    """Configuration changes and leadership transfer at the leader."""

    __slots__ = ("_become_follower", "_election", "_ls", "_proposals", "_repl", "_st",
                 "conf_change_error")

    def __init__(self, st: RaftState, ls: LogState, repl: Replication, election: Election,
                 proposals: Proposals, *,
                 become_follower: Callable[[int, NodeId | None], None]) -> None:
        self._st = st
        self._ls = ls
        self._repl = repl
        self._election = election
        self._proposals = proposals
        self._become_follower = become_follower
        self.conf_change_error: str | None = None
        """Why the last `ProposeConfChange` was refused, if it was."""

    def propose_conf_change(self, change: confchange.ConfChange) -> None:
        st = self._st
        ls = self._ls
        self.conf_change_error = None
        if st.role is not Role.LEADER:
            self.conf_change_error = "not leader"
            return
        cfg_index, cfg = ls.log.latest_config()
        if cfg_index > ls.commit or cfg.joint:
            self.conf_change_error = "a membership change is in progress"
            return
        if ls.log.term_at(ls.commit) != st.term:
            self.conf_change_error = "leader has not committed an entry of its term yet"
            return
        prs = self._repl.prs
        for n in change.add_voters:
            pr = prs.get(n)
            if n in cfg.learners and (pr is None or pr.match < ls.commit):
                self.conf_change_error = f"learner {n} has not caught up"
                return
        try:
            new = confchange.enter_joint(cfg, change)
        except confchange.ConfChangeError as e:
            self.conf_change_error = str(e)
            return
        ls.append([Entry(index=ls.log.last_index() + 1, term=st.term,
                         kind=EntryKind.CONFIG, config=new)])
        self._repl.broadcast_append(allow_empty=False)

    def transfer_leadership(self, to: NodeId) -> None:
        st = self._st
        if st.role is not Role.LEADER or to == st.id or to not in self._ls.config.voters:
            return
        st.lead_transferee = to
        self._election.election_elapsed = 0
        pr = self._repl.prs[to]
        if pr.match == self._ls.log.last_index():
            st.send(to, TimeoutNow(term=st.term, leader_id=st.id))
        else:
            self._repl.send_append(to, allow_empty=False)

    def after_commit(self) -> None:
        """Leader: propagate a new commit index, finish joint changes, step down if removed."""
        st = self._st
        ls = self._ls
        self._repl.broadcast_append()
        cfg_index, cfg = ls.log.latest_config()
        if cfg_index <= ls.commit:
            if cfg.joint:
                ls.append([Entry(index=ls.log.last_index() + 1, term=st.term,
                                 kind=EntryKind.CONFIG, config=confchange.leave_joint(cfg))])
                self._repl.broadcast_append(allow_empty=False)
            elif st.id not in cfg.voters:
                self._become_follower(st.term, None)  # Ref: §4.2.2 removing the leader
        readonly = self._proposals.readonly
        if readonly.queued and not readonly.rounds:
            self._proposals.start_read_round()
