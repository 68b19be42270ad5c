"""The amnesia fence: a node that lost its durable record signs no endorsement, refusal or
veto vote until its clock passes restart + max_deadline_lead_ms + gc_horizon_ms, still
commits and applies certified transactions, and keeps the fence across a second crash."""

from __future__ import annotations

from leaderless_harness import EPOCH, REGISTRY, endorsement, make_tx, run, solo, tx_id, version

from phalanx.consensus.core import Receive, Tick
from phalanx.consensus.leaderless.messages import (
    Endorsement,
    EndorsementBatch,
    LeaderlessDurableState,
    Refusal,
    SignatureResend,
    StartCheckpoint,
    VetoChoice,
)
from phalanx.consensus.types import NodeId

N2, N3, N4 = NodeId("n2"), NodeId("n3"), NodeId("n4")
LEAD, HORIZON = 5_000, 1_000
FENCE = LEAD + HORIZON


def _signed(ready: object) -> list[object]:
    return [s.message for s in ready.messages  # type: ignore[attr-defined]
            if isinstance(s.message, Endorsement | EndorsementBatch | Refusal | VetoChoice
                          | SignatureResend)]


def test_a_node_without_its_record_would_endorse_a_conflicting_transaction() -> None:
    """The hazard the fence closes: n1 endorsed `set x` unconditionally, lost its record,
    and (not fenced) endorses a conflicting `set x` unconditionally too."""
    core, app = solo(max_deadline_lead_ms=LEAD, gc_horizon_ms=HORIZON)
    run(core, app, Tick(now_ms=EPOCH))
    first = make_tx("set x 1", reqs={"x": version(None)}, no=1, deadline=EPOCH + 1000)
    assert _signed(run(core, app, Receive(src=N2, message=first)))
    second = make_tx("set x 2", reqs={"x": version(None)}, no=2, deadline=EPOCH + 1000)
    for recovering, expect in ((False, True), (True, False)):
        core, app = solo(max_deadline_lead_ms=LEAD, gc_horizon_ms=HORIZON,
                         recovering=recovering)
        run(core, app, Tick(now_ms=EPOCH + 10))
        signed = _signed(run(core, app, Receive(src=N2, message=second)))
        assert bool(signed) is expect, (recovering, signed)


def test_fenced_node_signs_nothing_but_commits_and_applies() -> None:
    core, app = solo(max_deadline_lead_ms=LEAD, gc_horizon_ms=HORIZON, recovering=True)
    assert core.status().recovering
    ready = run(core, app, Tick(now_ms=EPOCH))
    assert isinstance(ready.core_state, LeaderlessDurableState)
    assert ready.core_state.fence_until_ms == EPOCH + FENCE
    tx = make_tx("add x 5", deadline=EPOCH + 100)
    assert not _signed(run(core, app, Receive(src=N2, message=tx)))
    for node in (N2, N3, N4):  # a commit certificate from the others: applied here
        run(core, app, Receive(src=node, message=endorsement(node, tx)))
    assert app.data == {"x": b"5"}
    late = make_tx("add y 1", no=2, deadline=EPOCH + 200)
    run(core, app, Receive(src=N2, message=late))
    ready = run(core, app, Tick(now_ms=EPOCH + 300))  # past its deadline: no refusal
    assert not _signed(ready)
    ready = run(core, app, Receive(src=N2, message=StartCheckpoint(tx_ids=(tx_id(late),))))
    assert not _signed(ready)
    assert core.status().recovering
    ready = run(core, app, Tick(now_ms=EPOCH + FENCE))  # the fence ends
    assert not core.status().recovering
    fresh = make_tx("add z 1", no=3, deadline=EPOCH + FENCE + 100)
    assert _signed(run(core, app, Receive(src=N2, message=fresh)))


def test_the_fence_survives_a_second_crash() -> None:
    core, app = solo(max_deadline_lead_ms=LEAD, gc_horizon_ms=HORIZON, recovering=True)
    state = run(core, app, Tick(now_ms=EPOCH)).core_state
    assert isinstance(state, LeaderlessDurableState)
    state = REGISTRY.decode(REGISTRY.encode(state), expected=LeaderlessDurableState)
    # Restarted from the record (not in recovery any more): still fenced until its end.
    core, app = solo(max_deadline_lead_ms=LEAD, gc_horizon_ms=HORIZON, restored=state)
    assert core.status().recovering
    run(core, app, Tick(now_ms=EPOCH + FENCE - 1))
    tx = make_tx("add x 1", deadline=EPOCH + FENCE + 100)
    assert not _signed(run(core, app, Receive(src=N2, message=tx)))
    ready = run(core, app, Tick(now_ms=EPOCH + FENCE))  # ends: endorsed on this tick
    assert not core.status().recovering
    assert _signed(ready)
    # Recovering again (the record lost once more) restarts the fence from the new clock.
    core, app = solo(max_deadline_lead_ms=LEAD, gc_horizon_ms=HORIZON, restored=state,
                     recovering=True)
    run(core, app, Tick(now_ms=EPOCH + 50))
    assert core.durable_state().fence_until_ms == EPOCH + 50 + FENCE
