"""The per-client bound on undecided transactions (`LeaderlessConfig.max_pending_per_client`,
docs/LEADERLESS.md "Per-client bound"): one client's undecided transactions (stuck ones a
checkpoint cannot decide while a node is silent, or a flood) cannot make every client's
submit `overloaded`."""

from __future__ import annotations

import pytest
from leaderless_harness import EPOCH, endorsement, make_tx, run, solo, submit_of, tx_id

from phalanx.consensus.core import Receive, Tick
from phalanx.consensus.leaderless.config import LeaderlessConfig
from phalanx.consensus.leaderless.store import TxState
from phalanx.consensus.types import NodeId
from phalanx.protocols.leaderless_node import options_problem

N2, N3 = NodeId("n2"), NodeId("n3")


def _reasons(ready: object) -> list[str]:
    return [r.reason for r in ready.rejected]  # type: ignore[attr-defined]


def test_a_client_over_its_bound_is_refused_while_others_proceed() -> None:
    """c1 holds 3 undecided transactions here (their quorum never completes: a node away);
    with `max_pending` 4 it used to fill the table, and c2's submit was `overloaded`. With
    a per-client bound of 3, c1's fourth submit is refused with a clear reason (a RETRY,
    not `invalid`: another node may take it) and c2's goes in."""
    core, app = solo(max_pending=4, max_pending_per_client=3)
    run(core, app, Tick(now_ms=EPOCH))
    for no in range(1, 4):
        ready = run(core, app, submit_of(make_tx(f"set k{no} v", client="c1", no=no)))
        assert not ready.rejected
    ready = run(core, app, submit_of(make_tx("set k4 v", client="c1", no=4)))
    (rejection,) = ready.rejected
    assert "too many undecided transactions" in rejection.reason
    assert not rejection.invalid
    assert core.status().dropped.get("client_overloaded") == 1
    assert not _reasons(run(core, app, submit_of(make_tx("set j v", client="c2", no=1))))
    assert core.status().pending == 4


def test_the_bound_frees_as_transactions_are_decided() -> None:
    """A decision (here a commit on Q endorsements) takes a transaction out of its client's
    count: the client may submit again."""
    core, app = solo(max_pending_per_client=1)
    run(core, app, Tick(now_ms=EPOCH))
    first = make_tx("add a 1", client="c1", no=1)
    assert not _reasons(run(core, app, submit_of(first)))
    assert _reasons(run(core, app, submit_of(make_tx("set b 1", client="c1", no=2))))
    for node in ("n2", "n3"):
        run(core, app, Receive(src=NodeId(node), message=endorsement(node, first)))
    assert core._store.state_of(tx_id(first)) is TxState.COMMITTED
    assert core._store.pending_of("c1") == 0
    assert not _reasons(run(core, app, submit_of(make_tx("set b 1", client="c1", no=2))))


def test_relayed_transactions_and_retries_are_not_refused() -> None:
    """The bound is on new submits only: a peer's relay of the client's transaction is
    taken (its count may pass the bound: other nodes' bounds limit what they relay), and a
    client's retry of a held transaction is the duplicate it always was."""
    core, app = solo(max_pending_per_client=1)
    run(core, app, Tick(now_ms=EPOCH))
    held = make_tx("set a 1", client="c1", no=1)
    run(core, app, submit_of(held))
    run(core, app, Receive(src=N2, message=make_tx("set b 1", client="c1", no=2)))
    assert core._store.pending_of("c1") == 2
    assert not _reasons(run(core, app, submit_of(held)))
    assert core.status().duplicate.get("duplicate_submit") == 1


def test_the_option_is_checked() -> None:
    """A core option, and a node config `[protocol]` option (`cluster init --option`)."""
    assert options_problem({"max_pending_per_client": "16"}) is None
    assert options_problem({"max_pending_per_client": "0"}) == (
        "[protocol] max_pending_per_client must be >= 1, got 0")
    with pytest.raises(ValueError, match="max_pending_per_client"):
        LeaderlessConfig(node_id=NodeId("n1"), nodes=(NodeId("n1"),), max_pending_per_client=0)
    assert LeaderlessConfig(node_id=NodeId("n1"), nodes=(NodeId("n1"),)
                            ).max_pending_per_client == 1024
