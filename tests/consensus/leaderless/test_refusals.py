"""RefusalTally: the abort-certificate threshold n-Q+1+f, never reached early."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.consensus.leaderless.messages import Refusal
from phalanx.consensus.leaderless.refusals import RefusalTally, abort_threshold
from phalanx.consensus.types import LocalProtocolError

TX = b"\x01" * 32
OTHER = b"\x02" * 32


def params(n: int) -> tuple[int, int]:
    f = (n - 1) // 3
    return f, math.ceil((n + f + 1) / 2)


def refusal(node: int, tx: bytes = TX) -> Refusal:
    return Refusal(tx_id=tx, endorser=f"n{node:02d}", signature=b"sig")


@pytest.mark.parametrize(("n", "expected"), [(4, 3), (7, 5), (10, 7)])
def test_threshold_is_2f_plus_1_at_3f_plus_1(n: int, expected: int) -> None:
    f, q = params(n)
    assert abort_threshold(n=n, f=f, quorum=q) == expected == 2 * f + 1
    # The argument: the honest refusers (at least threshold - f) never endorse, so at most
    # Q-1 nodes can ever endorse the transaction.
    assert n - (expected - f) == q - 1


def test_larger_policy_quorum_needs_fewer_refusals() -> None:
    assert abort_threshold(n=7, f=2, quorum=6) == 4
    assert abort_threshold(n=7, f=2, quorum=7) == 3


@settings(max_examples=60, deadline=None)
@given(n=st.sampled_from([4, 7, 10]), data=st.data())
def test_certificate_exactly_at_threshold(n: int, data: st.DataObject) -> None:
    f, q = params(n)
    tally = RefusalTally(n=n, f=f, quorum=q)
    order = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3 * n))
    seen: set[int] = set()
    for node in order:
        tally.add(refusal(node))
        tally.add(refusal(node, OTHER) if node == 0 else refusal(node))  # noise, duplicates
        seen.add(node)
        cert = tally.certificate(TX)
        if len(seen) < tally.threshold:
            assert cert is None
        else:
            assert cert is not None
            assert len(cert) == tally.threshold
            endorsers = [r.endorser for r in cert]
            assert endorsers == sorted(set(endorsers))
            assert {int(e[1:]) for e in endorsers} <= seen
        assert tally.count(TX) == len(seen)


def test_duplicate_keeps_first_and_forget() -> None:
    tally = RefusalTally(n=4, f=1, quorum=3)
    first = refusal(1)
    tally.add(first)
    tally.add(Refusal(tx_id=TX, endorser="n01", signature=b"other"))
    assert tally.count(TX) == 1
    tally.add(refusal(2))
    tally.add(refusal(3))
    cert = tally.certificate(TX)
    assert cert is not None
    assert cert[0] is first
    assert len(tally) == 1
    tally.forget(TX)
    assert len(tally) == 0
    assert tally.certificate(TX) is None
    tally.forget(TX)  # idempotent


@pytest.mark.parametrize(("n", "f", "q"), [(4, 1, 1), (4, 1, 5), (0, 0, 1), (4, -1, 3)])
def test_misconfiguration_raises(n: int, f: int, q: int) -> None:
    with pytest.raises(LocalProtocolError):
        RefusalTally(n=n, f=f, quorum=q)
