"""A slow follower is not a lost one (issue #4).

When an AppendEntries round trip takes several heartbeat intervals, the answers to the
heartbeats already in flight arrive before the AppendEntries answer. The leader learns how
many (the follower's lag) and keeps such a follower in REPLICATE (no resend, no pause); a
window with no answer for STALL_LIMIT heartbeats past the lag (at most two election timeouts)
is presumed lost and probed.
"""

from __future__ import annotations

from test_core import N2, N3, core, make_leader, recv, sent, step

from phalanx.consensus.core import Submit, Tick
from phalanx.consensus.raft import (
    AppendEntries,
    AppendEntriesResponse,
    HeartbeatResponse,
    RaftCore,
)
from phalanx.consensus.raft.progress import STALL_LIMIT, ProgressState, stall_limit
from phalanx.consensus.types import ClientRequest


def replicating_leader() -> RaftCore:
    c = core(pre_vote=False, election_ticks=10, heartbeat_ticks=1)
    make_leader(c)
    for p in (N2, N3):
        recv(c, p, AppendEntriesResponse(term=c.term, success=True,
                                         match_index=c.log.last_index()))
    return c


def slow_round(c: RaftCore, n: int, heartbeats: int) -> list[AppendEntries]:
    """Propose one entry; `heartbeats` heartbeat rounds are answered before the
    AppendEntries answers arrive. Returns what the leader resent to n2 meanwhile."""
    step(c, Submit(request=ClientRequest(client_id="c", request_no=n, command=b"x")))
    last = c.log.last_index()
    resent: list[AppendEntries] = []
    for _ in range(heartbeats):
        step(c, Tick())
        for p in (N2, N3):
            rd = recv(c, p, HeartbeatResponse(term=c.term))
            resent += [m for to, m in sent(rd, AppendEntries) if to == N2]
    for p in (N2, N3):
        recv(c, p, AppendEntriesResponse(term=c.term, success=True, match_index=last))
    assert c.commit == last
    return resent


def test_answers_trailing_heartbeats_keep_the_follower_replicating() -> None:
    # The first slow round looks like a lost window (nothing is known yet) and is probed
    # once; its late answer teaches the leader the follower's lag, and from then on slow
    # rounds are waited for: nothing resent, the follower stays in REPLICATE. With the fixed
    # limit of two, every round resent the entry and paused the follower.
    c = replicating_leader()
    slow = 5
    assert slow_round(c, 1, slow)
    for n in range(2, 8):
        assert slow_round(c, n, slow) == []
        assert c.prs[N2].state is ProgressState.REPLICATE


def test_a_lost_window_is_still_probed_after_the_learnt_lag() -> None:
    c = replicating_leader()
    slow_round(c, 1, 3)
    slow_round(c, 2, 3)
    lag = c.prs[N2].lag
    assert lag == 3
    step(c, Submit(request=ClientRequest(client_id="c", request_no=3, command=b"x")))
    resent: list[tuple[int, AppendEntries]] = []
    for k in range(1, stall_limit(10, 1) + 1):
        step(c, Tick())
        # n3 keeps the quorum (and the leader) alive; n2's window was lost.
        recv(c, N3, AppendEntriesResponse(term=c.term, success=True,
                                          match_index=c.log.last_index()))
        rd = recv(c, N2, HeartbeatResponse(term=c.term))
        resent += [(k, m) for to, m in sent(rd, AppendEntries) if to == N2]
    # Probed at STALL_LIMIT answers past the lag, from the first unacknowledged entry.
    assert resent[0][0] == STALL_LIMIT + lag
    assert resent[0][1].entries
