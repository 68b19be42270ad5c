"""Membership changes by joint consensus (§4.3 of the dissertation; etcd's confchange/).

Owns: validating a requested change against the configuration in force and computing the
configuration to append, as pure functions of their arguments.

Rules:
- Pure: imports only `phalanx.consensus.types`. Never mutates its input; an invalid change
  raises `ConfChangeError` before anything takes effect.
- A change is two steps: `enter_joint` returns C_old,new (voters = new set, voters_outgoing =
  old set); once that is committed the leader appends `leave_joint`'s C_new. A configuration
  is never changed while it is joint.
- `Configuration.addresses` (peer addresses of nodes added at run time) is carried from
  one configuration to the next: a change's `addresses` are added, and an address is kept
  only while its node is a member (a removed node's goes with it).
- Learners receive the log but never vote (§4.2.1: new servers catch up as non-voting
  members before they can be promoted). Demoting a voter directly is refused (remove it,
  then add it back as a learner), which keeps learners and outgoing voters disjoint.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from phalanx.consensus.types import (
    Configuration,
    NodeId,
    address_map,
    format_addresses,
)


class ConfChangeError(Exception):
    """A membership change that cannot be applied to the current configuration."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfChange:
    """A requested membership change: sets of node ids to add or remove.

    Attributes:
        add_voters: become voters (learners are promoted; new nodes join as voters directly).
        remove_voters: stop voting and leave the cluster (this may include the leader).
        add_learners: join (or, for a voter, be demoted) as non-voting learners.
        remove_learners: learners that leave the cluster.
        addresses: peer addresses (``(id, "host:port")``) of added nodes, recorded in the
            configuration so that running nodes link to them (`Configuration.addresses`).
    """

    add_voters: tuple[NodeId, ...] = ()
    remove_voters: tuple[NodeId, ...] = ()
    add_learners: tuple[NodeId, ...] = ()
    remove_learners: tuple[NodeId, ...] = ()
    addresses: tuple[tuple[NodeId, str], ...] = ()

    def __post_init__(self) -> None:
        seen: set[NodeId] = set()
        for group in (self.add_voters, self.remove_voters, self.add_learners,
                      self.remove_learners):
            for n in group:
                if n in seen:
                    raise ConfChangeError(f"node {n} appears twice in one change")
                seen.add(n)
        if not seen:
            raise ConfChangeError("an empty membership change")


def _sorted(nodes: Iterable[NodeId]) -> tuple[NodeId, ...]:
    return tuple(sorted(set(nodes)))


def _addresses(config: Configuration, change: ConfChange | None,
               members: Iterable[NodeId]) -> str:
    """`config`'s addresses plus `change`'s, only for `members`, canonical."""
    known = address_map(config.addresses)
    if change is not None:
        known.update((str(n), a) for n, a in change.addresses
                     if a and "," not in a and "=" not in a)
    keep = set(map(str, members))
    return format_addresses({n: a for n, a in known.items() if n in keep})


def enter_joint(config: Configuration, change: ConfChange) -> Configuration:
    """The joint configuration C_old,new for `change` applied to the simple `config`; when
    the voters do not change (learners only), directly the new simple configuration."""
    if config.joint:
        raise ConfChangeError("configuration is already joint; leave it first")
    voters = set(config.voters)
    learners = set(config.learners)
    for n in change.add_voters:
        if n in voters:
            raise ConfChangeError(f"{n} is already a voter")
        learners.discard(n)
        voters.add(n)
    for n in change.remove_voters:
        if n not in voters:
            raise ConfChangeError(f"{n} is not a voter")
        voters.discard(n)
    for n in change.add_learners:
        if n in learners:
            raise ConfChangeError(f"{n} is already a learner")
        if n in voters:
            raise ConfChangeError(f"{n} is a voter; remove it, then add it as a learner")
        learners.add(n)
    for n in change.remove_learners:
        if n not in learners:
            raise ConfChangeError(f"{n} is not a learner")
        learners.discard(n)
    if not voters:
        raise ConfChangeError("a configuration needs at least one voter")
    if voters == set(config.voters):
        # Only learners change: quorums are untouched, so no joint step is needed.
        return Configuration(voters=config.voters, learners=_sorted(learners),
                             addresses=_addresses(config, change, voters | learners))
    return Configuration(
        voters=_sorted(voters),
        voters_outgoing=_sorted(config.voters),
        learners=_sorted(learners),
        addresses=_addresses(config, change, voters | learners | set(config.voters)),
    )


def leave_joint(config: Configuration) -> Configuration:
    """C_new: the incoming half of the joint `config`, without the outgoing voters."""
    if not config.joint:
        raise ConfChangeError("configuration is not joint")
    return Configuration(voters=config.voters, learners=config.learners,
                         addresses=_addresses(config, None, config.voters + config.learners))
