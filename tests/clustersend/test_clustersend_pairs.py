"""Pair schedules: PCS pairs are a deterministic function of the agreed seed; the permutation
variant never needs more than f1+f2+1 attempts whatever the faulty sets; the bijective
baseline always has a good pair in its first attempt; PCS's first good attempt averages 1/p."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from phalanx.clustersend.pairs import (
    Mode,
    link_seed,
    permutation,
    schedule,
    worst_case_attempts,
)

names = st.sampled_from(["A", "B", "shard-1", "shard-2"])


@settings(max_examples=100, deadline=None)
@given(src=names, dst=names, epoch=st.integers(0, 5), seq=st.integers(0, 10**6),
       n1=st.integers(1, 40), n2=st.integers(1, 40), mode=st.sampled_from(tuple(Mode)))
def test_pairs_are_deterministic_from_the_agreed_seed(src: str, dst: str, epoch: int,
                                                      seq: int, n1: int, n2: int,
                                                      mode: Mode) -> None:
    seed = link_seed(src, dst, epoch, seq)
    assert seed == link_seed(src, dst, epoch, seq)
    f1, f2 = (n1 - 1) // 3, (n2 - 1) // 3
    for attempt in range(6):
        pairs = schedule(mode, seed, attempt, n1, n2, f1, f2)
        assert pairs == schedule(mode, link_seed(src, dst, epoch, seq), attempt, n1, n2, f1, f2)
        assert all(0 <= i < n1 and 0 <= j < n2 for i, j in pairs)
        if mode == Mode.BIJECTIVE:  # disjoint pairs
            assert len({i for i, _ in pairs}) == len({j for _, j in pairs}) == len(pairs)
    assert sorted(permutation(seed, b"S", n1)) == list(range(n1))


def test_pcs_pairs_differ_between_sends() -> None:
    runs = {tuple(schedule(Mode.PCS, link_seed("A", "B", 0, seq), a, 7, 7, 2, 2)[0]
                  for a in range(8)) for seq in range(50)}
    assert len(runs) == 50


@st.composite
def clusters_and_faults(draw: st.DrawFn) -> tuple[int, int, int, int, set[int], set[int]]:
    n1, n2 = draw(st.integers(1, 16)), draw(st.integers(1, 16))
    f1 = draw(st.integers(0, (n1 - 1) // 2))  # crash (2f+1) or Byzantine (3f+1) sized
    f2 = draw(st.integers(0, (n2 - 1) // 2))
    bad1 = draw(st.sets(st.integers(0, n1 - 1), max_size=f1))
    bad2 = draw(st.sets(st.integers(0, n2 - 1), max_size=f2))
    return n1, n2, f1, f2, bad1, bad2


@settings(max_examples=200, deadline=None)
@given(world=clusters_and_faults(), seq=st.integers(0, 10**9))
def test_permutation_never_needs_more_than_f1_plus_f2_plus_1_attempts(
        world: tuple[int, int, int, int, set[int], set[int]], seq: int) -> None:
    n1, n2, f1, f2, bad1, bad2 = world
    assume(f1 + f2 + 1 <= min(n1, n2))
    bound = worst_case_attempts(Mode.PERMUTATION, n1, n2, f1, f2)
    assert bound == f1 + f2 + 1
    seed = link_seed("A", "B", 0, seq)
    firsts = [a for a in range(bound)
              for i, j in schedule(Mode.PERMUTATION, seed, a, n1, n2, f1, f2)
              if i not in bad1 and j not in bad2]
    assert firsts, f"no good pair in {bound} attempts: n=({n1},{n2}) bad=({bad1},{bad2})"
    # The bijective baseline: a good pair in its first (and only) attempt.
    assert any(i not in bad1 and j not in bad2
               for i, j in schedule(Mode.BIJECTIVE, seed, 0, n1, n2, f1, f2))


def test_pcs_first_good_attempt_averages_one_over_p() -> None:
    """n = 4, f = 1 both sides, one faulty each: p = (3/4)^2, E[steps] = 1/p = 1.78."""
    n, bad = 4, 0
    steps = []
    for seq in range(4000):
        seed = link_seed("A", "B", 0, seq)
        steps.append(next(a + 1 for a in range(1000)
                          if (p := schedule(Mode.PCS, seed, a, n, n, 1, 1)[0])[0] != bad
                          and p[1] != bad))
    mean = sum(steps) / len(steps)
    assert abs(mean - 1 / 0.5625) < 0.08, mean
