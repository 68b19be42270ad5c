"""The batched flush of the votes' reliable broadcast (`reliable_broadcast.py`): what waits
for the next flush, and how it goes out.

Owns: `Pending` (echoes and readies, by digest, waiting for the next flush, keyed by
instance: at most one of each per instance) and `batches` (a flush as `VoteDigestBatch`es,
one per checkpoint, at most `MAX_BATCH_ITEMS` echoes and readies each; docs/LEADERLESS.md
"Batched echoes and readies").

Invariants: deterministic (insertion-ordered dicts: checkpoints in the order they first
appear, items in the order they were chosen); pure (no I/O, no state beyond `Pending`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from phalanx.consensus.leaderless.messages import VoteDigestBatch
from phalanx.consensus.types import NodeId

Key = tuple[NodeId, bytes]
"""An instance: (voter, checkpoint id)."""

MAX_BATCH_ITEMS = 256
"""At most this many echoes, and as many readies, in one `VoteDigestBatch` (or the older
`VoteBatch`; a correct sender splits; a receiver drops a larger one whole)."""


@dataclass(slots=True)
class Pending:
    """Echoes and readies (digests) waiting for the next flush, keyed by instance (one
    each)."""

    echoes: dict[Key, bytes] = field(default_factory=dict)
    readies: dict[Key, bytes] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.echoes or self.readies)



def batches(pending: Pending) -> list[VoteDigestBatch]:
    """`pending` as `VoteDigestBatch`es, one per checkpoint (in the order the checkpoints
    first appear), of at most `MAX_BATCH_ITEMS` echoes and readies each."""
    groups: dict[bytes, tuple[list[NodeId], list[bytes], list[NodeId], list[bytes]]] = {}
    for (voter, cid), d in pending.echoes.items():
        g = groups.setdefault(cid, ([], [], [], []))
        g[0].append(voter)
        g[1].append(d)
    for (voter, cid), d in pending.readies.items():
        g = groups.setdefault(cid, ([], [], [], []))
        g[2].append(voter)
        g[3].append(d)
    m = MAX_BATCH_ITEMS
    return [VoteDigestBatch(checkpoint=cid, echo_voters=tuple(ev[i:i + m]),
                            echo_digests=tuple(ed[i:i + m]), ready_voters=tuple(rv[i:i + m]),
                            ready_digests=tuple(rd[i:i + m]))
            for cid, (ev, ed, rv, rd) in groups.items()
            for i in range(0, max(len(ev), len(rv)), m)]
