"""Who sends to whom: the sender/receiver pairs of each attempt, from an agreed seed.

Owns: `Mode` (PCS, PERMUTATION, BIJECTIVE), `link_seed` (the seed every member of both
clusters derives from the certified statement: sending cluster, receiving cluster, epoch,
sequence number) and `schedule` (attempt -> the (sender index, receiver index) pairs).

- PCS (protocols.md §2.5): attempt i uses one pair, each index drawn uniformly from
  SHA-256(seed, label, i): with replacement, so a step succeeds with
  p = (nf1/n1)(nf2/n2), independently of the others (expected 1/p steps).
- PERMUTATION (§2.6): cycles of m = min(n1, n2) attempts; cycle c draws seeded permutations
  pi1_c of C1 and pi2_c of C2, and its r-th attempt uses (pi1_c[r], pi2_c[r]). Inside a
  cycle senders and receivers are all distinct, so when f1+f2+1 <= m at most f1+f2 of the
  first f1+f2+1 pairs touch a faulty member: the worst case is f1+f2+1 attempts, whatever the
  faulty sets (fixed before the seed). Later cycles re-draw (a member that missed the
  confirmation is not stuck retrying with the same faulty partner).
- BIJECTIVE (§2.4, the deterministic baseline): every attempt sends over k = f1+f2+1
  disjoint pairs at once (the first k positions of that attempt's seeded permutations), so
  attempt 0 always holds a good pair; retries (lossy links, or a member that missed the
  confirmation) re-draw.

Invariants: pure functions of their arguments (SHA-256 only; no `random`, no set order), so
every member of both clusters computes the same pairs; the seed is fixed by the certified
statement, which neither a client nor a primary can grind (the sequence number is assigned
by the sending cluster's ordering).
"""

from __future__ import annotations

import enum
import hashlib
from functools import lru_cache


class Mode(enum.StrEnum):
    PCS = "pcs"
    PERMUTATION = "permutation"
    BIJECTIVE = "bijective"


def link_seed(src_cluster: str, dst_cluster: str, epoch: int, seq: int) -> bytes:
    h = hashlib.sha256(b"phalanx-clustersend-pairs\x00")
    h.update(f"{src_cluster}\x00{dst_cluster}\x00{epoch}\x00{seq}".encode())
    return h.digest()


def draw(seed: bytes, label: bytes, i: int, bound: int) -> int:
    """A uniform integer in [0, bound) from (seed, label, i) (bias < 2**-56 for bound < 256)."""
    h = hashlib.sha256(seed + label + i.to_bytes(8, "big")).digest()
    return int.from_bytes(h[:8], "big") % bound


@lru_cache(maxsize=4096)
def permutation(seed: bytes, label: bytes, n: int) -> tuple[int, ...]:
    """A seeded permutation of range(n) (Fisher-Yates over `draw`)."""
    out = list(range(n))
    for i in range(n - 1, 0, -1):
        j = draw(seed, label, i, i + 1)
        out[i], out[j] = out[j], out[i]
    return tuple(out)


def schedule(mode: Mode, seed: bytes, attempt: int, n1: int, n2: int,
             f1: int, f2: int) -> tuple[tuple[int, int], ...]:
    """The (sender index, receiver index) pairs of `attempt` (indices into the clusters'
    sorted member lists)."""
    if mode == Mode.PCS:
        return ((draw(seed, b"S", attempt, n1), draw(seed, b"R", attempt, n2)),)
    if mode == Mode.PERMUTATION:
        # Cycles of m = min(n1, n2) attempts, each over fresh seeded permutations: pairs
        # without replacement inside a cycle; a member that missed its cluster's
        # confirmation is not stuck with the same (maybe faulty) partner in every cycle.
        cycle, r = divmod(attempt, min(n1, n2))
        label = str(cycle).encode()
        return ((permutation(seed, b"S" + label, n1)[r], permutation(seed, b"R" + label, n2)[r]),)
    k = min(f1 + f2 + 1, n1, n2)
    label = str(attempt).encode()
    p1, p2 = permutation(seed, b"S" + label, n1), permutation(seed, b"R" + label, n2)
    return tuple((p1[j], p2[j]) for j in range(k))


def worst_case_attempts(mode: Mode, n1: int, n2: int, f1: int, f2: int) -> int | None:
    """The bound on attempts with reliable links (None: only a probabilistic one)."""
    if mode == Mode.PCS:
        return None
    if f1 + f2 + 1 > min(n1, n2):
        return None
    return f1 + f2 + 1 if mode == Mode.PERMUTATION else 1


__all__ = ["Mode", "draw", "link_seed", "permutation", "schedule", "worst_case_attempts"]
