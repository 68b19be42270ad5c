"""`Configuration.addresses` through joint consensus (`phalanx.consensus.raft.confchange`):
a change's addresses are recorded, carried to the next configuration, kept only for
members, canonical (sorted, one encoding), and left off the wire when empty."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from phalanx.consensus.raft.confchange import (
    ConfChange,
    ConfChangeError,
    enter_joint,
    leave_joint,
)
from phalanx.consensus.types import Configuration, NodeId, address_map
from phalanx.net import wire

NODES = [NodeId(f"n{i}") for i in range(1, 7)]


def test_added_address_rides_along_and_goes_with_its_node() -> None:
    c = Configuration(voters=(NodeId("n1"), NodeId("n2"), NodeId("n3")))
    c = enter_joint(c, ConfChange(add_learners=(NodeId("n4"),),
                                  addresses=((NodeId("n4"), "10.0.0.4:7004"),)))
    assert c.addresses == "n4=10.0.0.4:7004"
    assert c.learners == ("n4",)
    c = leave_joint(enter_joint(c, ConfChange(add_voters=(NodeId("n4"),))))
    assert address_map(c.addresses) == {"n4": "10.0.0.4:7004"}
    c = leave_joint(enter_joint(c, ConfChange(remove_voters=(NodeId("n4"),))))
    assert c.addresses == ""
    assert wire.encode(c) == wire.encode(Configuration(voters=c.voters))  # off the wire
    # an address that would break the list is not recorded
    bad = enter_joint(c, ConfChange(add_learners=(NodeId("n5"),),
                                    addresses=((NodeId("n5"), "a,n6=b:1"),)))
    assert bad.addresses == ""


@given(st.lists(st.tuples(st.sampled_from(["add", "promote", "remove"]),
                          st.sampled_from(NODES)), max_size=12))
def test_addresses_belong_to_members_and_are_canonical(steps: list[tuple[str, NodeId]]) -> None:
    c = Configuration(voters=(NODES[0],))
    for op, n in steps:
        change = {"add": ConfChange(add_learners=(n,), addresses=((n, f"h{n}:1"),)),
                  "promote": ConfChange(add_voters=(n,)),
                  "remove": ConfChange(remove_voters=(n,)) if n in c.voters
                  else ConfChange(remove_learners=(n,))}[op]
        try:
            c = enter_joint(c, change)
        except ConfChangeError:  # refused: nothing changed
            continue
        if c.joint:
            c = leave_joint(c)
        known = address_map(c.addresses)
        assert set(known) <= set(c.members())
        assert list(known) == sorted(known)
        assert wire.decode(wire.encode(c)) == c
