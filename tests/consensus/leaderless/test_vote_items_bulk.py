"""`VoteBroadcast.on_digest_items` (the items of a `VoteDigestBatch` in bulk) does exactly
what the lone-message path did item by item: the same sends, deliveries, durable choices,
counted drops and per-instance state after any sequence of SENDs, batches (good, bad,
equivocating, of unknown instances), fetched bodies, fences and periods."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.consensus.crypto import FastCrypto, digest_of
from phalanx.consensus.leaderless.messages import VetoChoice
from phalanx.consensus.leaderless.reliable_broadcast import VoteBroadcast, _Instance
from phalanx.consensus.types import NodeId

CID = b"\x01" * 32
OTHER = b"\x02" * 32  # a checkpoint no instance is open for
HASH = FastCrypto(NodeId("n0"))


def vote(voter: str, variant: int) -> VetoChoice:
    """Distinct contents of one instance; variant 2 is judged invalid (`validate`)."""
    v = VetoChoice(checkpoint=CID, tx_ids=(bytes([variant + 1]),), voter=NodeId(voter),
                   drop=variant == 0)
    return dataclasses.replace(v, signature=FastCrypto(NodeId(voter)).sign(v))


def validate(v: VetoChoice) -> str | None:
    return "forged_veto" if v.tx_ids == (b"\x03",) else None


def per_item(rb: VoteBroadcast, counts: dict[str, int], src: NodeId, cid: bytes,
             voters: tuple[object, ...], digests: tuple[object, ...], *, echo: bool) -> None:
    """The old path: `CheckpointMachine._relay_item` for each item, then the lone
    message's handler (its drops counted in `counts`, as the machine counted them)."""
    members = set(rb._nodes)
    for voter, digest in zip(voters, digests, strict=True):
        if not isinstance(voter, str) or not isinstance(digest, bytes):
            reason = "bad_vote_batch_item"
        elif voter not in members:
            reason = "not_a_member"
        elif not rb.known((NodeId(voter), cid)):
            reason = "unknown_checkpoint"
        else:
            if echo:
                rb.on_echo_digest(src, (NodeId(voter), cid), digest)
            else:
                rb.on_ready_digest(src, (NodeId(voter), cid), digest)
            continue
        counts[reason] = counts.get(reason, 0) + 1


def state(inst: _Instance) -> tuple[object, ...]:
    return (inst.sent, inst.echoes, inst.readies, inst.echo, inst.ready, inst.delivered,
            {d: c for d, c in inst.echo_counts.items() if c},
            {d: c for d, c in inst.ready_counts.items() if c},
            inst.fetching, inst.asked, inst.asked_now, sorted(inst.contents))


EVENT = st.one_of(
    st.tuples(st.just("send"), st.integers(0, 6), st.integers(0, 2)),
    st.tuples(st.just("items"), st.integers(0, 6), st.booleans(),
              st.sampled_from([False] * 7 + [True]),
              st.lists(st.tuples(st.sampled_from([0, 1, 1, 2, 2, 3, 4, 5, 6, 7, 8]),
                                 st.sampled_from([0] * 6 + [1, 1, 2, 3, 4])), max_size=9)),
    st.tuples(st.just("body"), st.integers(0, 6), st.integers(0, 2)),
    st.tuples(st.just("fence"), st.booleans()),
    st.tuples(st.just("refetch")),
)


def honest(n: int, variant: int) -> list[tuple[object, ...]]:
    """Every voter's SEND of `variant` and every member's echoes and readies of all of them
    (two batches each): the traffic that crosses Q, f+1 and 2f+1."""
    half = [(v, variant) for v in range(n // 2)], [(v, variant) for v in range(n // 2, n)]
    return ([("send", v, variant) for v in range(1, n)]
            + [("items", s, echo, False, part) for s in range(1, n) for echo in (True, False)
               for part in half])


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.sampled_from([4, 7]), batch_ticks=st.sampled_from([0, 1]),
       noise=st.lists(EVENT, max_size=30), variant=st.sampled_from([0, 0, 1]))
def test_bulk_items_equal_the_lone_path(data: st.DataObject, n: int, batch_ticks: int,
                                        noise: list[tuple[object, ...]], variant: int) -> None:
    """Honest traffic and noise (bad, equivocating, unknown items, other bodies, fences,
    periods) in any order: the bulk path and the lone path stay identical throughout."""
    events = data.draw(st.permutations(honest(n, variant) + noise))
    nodes = tuple(NodeId(f"n{i}") for i in range(n))
    f = (n - 1) // 3
    bulk, lone = (VoteBroadcast(node_id=nodes[0], nodes=nodes, faults=f, hasher=HASH,
                                batch_ticks=batch_ticks) for _ in range(2))
    lone_drops: dict[str, int] = {}
    for rb in (bulk, lone):
        for voter in nodes:
            rb.open((voter, CID))
        rb.broadcast(vote("n0", 0))
    for event in events:
        kind = event[0]
        if kind == "send":
            voter = nodes[int(event[1]) % n]  # type: ignore[call-overload]
            if voter != nodes[0]:
                for rb in (bulk, lone):
                    rb.on_send(voter, vote(voter, int(event[2])), validate)  # type: ignore[call-overload]
        elif kind == "items":
            _, s, echo, other, items = event
            src = nodes[int(s) % n]  # type: ignore[call-overload]
            voters: list[object] = []
            digests: list[object] = []
            for v, d in items:  # type: ignore[attr-defined]
                voter_obj: object = (f"n{v}" if v < n else "n99" if v == n
                                     else b"junk" if v == n + 1 else f"n{v % n}")
                voters.append(voter_obj)
                name = voter_obj if isinstance(voter_obj, str) else "n1"
                digests.append(digest_of(HASH, vote(name, d)) if d < 3
                               else b"zz" if d == 3 else 7)
            cid = OTHER if other else CID
            bulk.on_digest_items(src, cid, tuple(voters), tuple(digests), echo=bool(echo))
            per_item(lone, lone_drops, src, cid, tuple(voters), tuple(digests),
                     echo=bool(echo))
        elif kind == "body":
            v = vote(nodes[int(event[1]) % n], int(event[2]))  # type: ignore[call-overload]
            for rb in (bulk, lone):
                if rb.expects(v):
                    rb.on_body(v, validate)
        elif kind == "fence":
            bulk.fenced = lone.fenced = bool(event[1])
        else:
            bulk.refetch()
            lone.refetch()
        for rb in (bulk, lone):
            rb.tick()
        assert bulk.drain() == lone.drain()
    for voter in nodes:
        assert state(bulk._instances[(voter, CID)]) == state(lone._instances[(voter, CID)])
    expected = dict(lone.dropped_counts())
    for reason, count in lone_drops.items():
        expected[reason] = expected.get(reason, 0) + count
    assert bulk.dropped_counts() == expected
    assert bulk.relays([(v, CID) for v in nodes]) == lone.relays([(v, CID) for v in nodes])
