"""Who sends to whom: the sender/receiver pairs of each attempt, from an agreed seed.

Owns: `Mode` (PCS, PERMUTATION, BIJECTIVE), `link_seed` (the seed every member of both
clusters derives from the certified statement: sending cluster, receiving cluster, epoch,
sequence number) and `schedule` (attempt -> the (sender index, receiver index) pairs).

- PCS (protocols.md §2.5): attempt i uses one pair, each index drawn uniformly from
  SHA-256(seed, label, i): with replacement, so a step succeeds with
  p = (nf1/n1)(nf2/n2), independently of the others (expected 1/p steps).
- PERMUTATION (§2.6): two seeded permutations pi1 of C1 and pi2 of C2; attempt i uses
  (pi1[i mod n1], pi2[(i + i div n1) mod n2]) (the receivers shift by one per cycle of the
  senders, so a member that missed its cluster's confirmation is not stuck retrying with the
  same faulty partner). When f1+f2+1 <= min(n1, n2), the first f1+f2+1 pairs have
  distinct senders and distinct receivers, so at most f1+f2 of them touch a faulty member:
  the worst case is f1+f2+1 attempts, whatever the faulty sets (fixed before the seed).
- BIJECTIVE (§2.4, the deterministic baseline): every attempt sends over f1+f2+1 disjoint
  pairs at once (pi1[j], pi2[j]); a retry (only needed on lossy links, or by a member that
  missed the confirmation) uses the next f1+f2+1 positions, the receivers shifted by the
  attempt number.

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
    p1, p2 = permutation(seed, b"S", n1), permutation(seed, b"R", n2)
    if mode == Mode.PERMUTATION:
        # Each full cycle of the senders shifts the receivers by one more position, so a
        # sender is not paired with the same (maybe faulty) receiver in every cycle.
        return ((p1[attempt % n1], p2[(attempt + attempt // n1) % n2]),)
    k = min(f1 + f2 + 1, n1, n2)
    base = attempt * k
    return tuple((p1[(base + j) % n1], p2[(base + j + attempt) % n2]) for j in range(k))


def worst_case_attempts(mode: Mode, n1: int, n2: int, f1: int, f2: int) -> int | None:
    """The bound on attempts with reliable links (None: only a probabilistic one)."""
    if mode == Mode.PCS:
        return None
    if f1 + f2 + 1 > min(n1, n2):
        return None
    return f1 + f2 + 1 if mode == Mode.PERMUTATION else 1


__all__ = ["Mode", "draw", "link_seed", "permutation", "schedule", "worst_case_attempts"]
