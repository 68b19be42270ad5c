"""`PbftBugs`, the one object that carries deliberate bugs into a replica: names in and out,
unknown names refused, and the default is the honest protocol."""

from __future__ import annotations

import pytest

from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.pbft import KNOWN_BUGS, NO_BUGS, PbftBugs, PbftConfig
from phalanx.consensus.pbft.bugs import UnfencedSafetyRules
from phalanx.consensus.pbft.messages import SafetyData
from phalanx.consensus.pbft.safety import SafetyRules
from phalanx.consensus.types import NodeId


def test_names_round_trip_and_default_is_none() -> None:
    assert PbftBugs() == NO_BUGS
    assert NO_BUGS.names == frozenset()
    assert PbftBugs.from_names(()) == NO_BUGS
    assert {
        "commit_on_2f", "skip_view_check", "accept_unsigned_view_change", "no_view_fence",
    } == KNOWN_BUGS
    for name in KNOWN_BUGS:
        bugs = PbftBugs.from_names([name])
        assert bugs.names == {name}
        assert getattr(bugs, name) is True
    assert PbftBugs.from_names(KNOWN_BUGS).names == KNOWN_BUGS


def test_an_unknown_name_raises_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown PBFT bug") as err:
        PbftBugs.from_names(["commit_on_2f", "typo"])
    assert "typo" in str(err.value)
    assert all(name in str(err.value) for name in KNOWN_BUGS)


def test_no_view_fence_forgets_the_restart_fence() -> None:
    signer = FastCrypto(NodeId("n1"))
    record = SafetyData(early_view=3)
    assert SafetyRules(signer, record).fenced(3)
    assert not UnfencedSafetyRules(signer, record).fenced(3)
    assert UnfencedSafetyRules(signer, record).early_view == 3  # only the fence goes


def test_a_config_carries_no_bugs() -> None:
    replicas = tuple(NodeId(f"n{i}") for i in range(4))
    with pytest.raises(TypeError):
        PbftConfig(node_id=replicas[0], replicas=replicas, bugs=frozenset())  # type: ignore[call-arg]
