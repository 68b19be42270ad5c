"""`SignatureResend` (wire id 350): a node's re-sent signatures travel in one message per
peer per period; each item counts exactly as if it came alone, a forged item is dropped
alone, an oversized message is one drop."""

from __future__ import annotations

import dataclasses

from leaderless_harness import EPOCH, endorsement, make_tx, run, solo

from phalanx.consensus.core import Receive, Tick
from phalanx.consensus.leaderless.messages import SignatureResend
from phalanx.consensus.leaderless.recovery import MAX_RESEND_ITEMS
from phalanx.consensus.types import NodeId

N2, N3 = NodeId("n2"), NodeId("n3")


def test_items_count_as_if_sent_alone() -> None:
    core, app = solo()
    run(core, app, Tick(now_ms=EPOCH))
    tx = make_tx("add x 1")
    run(core, app, Receive(src=N2, message=tx))
    assert app.data == {}
    run(core, app, Receive(src=N2, message=SignatureResend(
        endorsements=(endorsement("n2", tx), endorsement("n3", tx)))))
    assert app.data == {"x": b"1"}
    again = SignatureResend(endorsements=(endorsement("n2", tx),))
    run(core, app, Receive(src=N2, message=again))
    assert core.status().duplicate == {"duplicate_endorsement": 1}  # held: no check


def test_a_forged_item_is_dropped_alone() -> None:
    core, app = solo()
    run(core, app, Tick(now_ms=EPOCH))
    tx = make_tx("add x 1")
    run(core, app, Receive(src=N2, message=tx))
    forged = dataclasses.replace(endorsement("n3", tx), signature=b"\x00" * 32)
    run(core, app, Receive(src=N2, message=SignatureResend(
        endorsements=(forged, endorsement("n2", tx)))))
    assert app.data == {}
    assert sum(core.status().dropped.values()) == 1
    run(core, app, Receive(src=N3, message=SignatureResend(endorsements=(endorsement("n3", tx),))))
    assert app.data == {"x": b"1"}


def test_an_oversized_resend_is_one_drop() -> None:
    core, app = solo()
    run(core, app, Tick(now_ms=EPOCH))
    tx = make_tx("add x 1")
    run(core, app, Receive(src=N2, message=tx))
    big = SignatureResend(endorsements=(endorsement("n2", tx),) * (MAX_RESEND_ITEMS + 1))
    run(core, app, Receive(src=N2, message=big))
    assert core.status().dropped == {"oversized_resend": 1}


def test_own_re_sends_leave_in_one_message_per_peer() -> None:
    core, app = solo(rebroadcast_ticks=2)
    run(core, app, Tick(now_ms=EPOCH))
    for no in range(1, 6):
        run(core, app, Receive(src=N2, message=make_tx(f"add k{no} 1", no=no,
                                                        deadline=EPOCH + 10**5)))
    resends = []
    for t in range(1, 4):
        ready = run(core, app, Tick(now_ms=EPOCH + t))
        resends += [s for s in ready.messages if isinstance(s.message, SignatureResend)]
    assert sorted(s.to for s in resends) == ["n2", "n3", "n4"]
    assert all(len(s.message.endorsements) == 5 for s in resends)  # type: ignore[attr-defined]
