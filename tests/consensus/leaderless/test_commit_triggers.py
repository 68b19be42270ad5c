"""What makes a pending record commit (docs/LEADERLESS.md "Answers by what the asker holds",
"Seed 44 and the body-alone answers"): a proof carrying nothing but the body changes nothing
at a node that holds the transaction, and a record that became committable without a commit
attempt commits at the next period's full pass (`ticks.py`), with no message. Together:
no answer is needed to "retry" a commit, so an answer with nothing left for an asker that
holds the transaction is not sent (`Recovery.answer`)."""

from __future__ import annotations

from leaderless_harness import (
    EPOCH,
    endorsement,
    pending_at_n1,
    run,
    tx_id,
)

from phalanx.consensus.core import Receive, Tick
from phalanx.consensus.leaderless.messages import TransactionProof
from phalanx.consensus.types import NodeId

N2, N3 = NodeId("n2"), NodeId("n3")


def test_a_body_alone_proof_changes_nothing_at_a_holder() -> None:
    core, app, tx = pending_at_n1()
    before = core.durable_state()
    ready = run(core, app, Receive(src=N3, message=TransactionProof(tx=tx)))
    assert ready.messages == ()
    assert ready.committed == ()
    assert ready.core_state is None  # nothing to record
    assert core.status().pending == 1
    assert core.status().committed == 0
    assert core.durable_state() == before


def test_a_committable_record_commits_at_the_next_period_without_a_message() -> None:
    """Whatever makes a record committable without trying its commit (here: n3's
    endorsement put into the record by hand, no intake), the period's full pass commits it:
    a record never waits for a proof's arrival to commit."""
    core, app, tx = pending_at_n1()
    record = core._store.get(tx_id(tx))  # white box: no intake, no retry
    assert record is not None
    record.endorsements[N3] = endorsement("n3", tx)
    core._rules.invalidate()
    assert core.status().committed == 0
    period = core._config.rebroadcast_ticks
    now = EPOCH
    for _ in range(period):
        now += 10
        run(core, app, Tick(now_ms=now))
        if core.status().committed:
            break
    assert core.status().committed == 1
    assert core.status().pending == 0
    assert app.applied() == 1
