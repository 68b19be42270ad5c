"""Batching for `LeaderlessCore` (a mixin over the core's state: see `parts.py`): the
`SubmitBatch` input (a driver pass's client writes in one step, `propose_batch`) and
`_seal`, which signs the step's endorsements under one signature and sends them as one
`EndorsementBatch` per peer (`endorsement_batch.py`, docs/LEADERLESS.md "Batch
endorsements").

Invariants: an own endorsement is decided (`SafetyKernel.endorse`, unsigned), then sealed
in the same step, before the step's Ready is built: it joins its record (and counts
towards commit) only once signed, and it leaves in `Ready.messages` of the Ready whose
`core_state` (with `must_sync`) records it, as before.

Must not import: trio, sockets, clocks, global random, `phalanx.net`.
"""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.consensus.leaderless.endorsement_batch import batch_of
from phalanx.consensus.leaderless.parts import CoreParts, Outbox
from phalanx.consensus.leaderless.store import TxState
from phalanx.consensus.types import ClientRequest


@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitBatch:
    """Several client writes stepped at once (the driver's `propose_batch`: the writes of
    one pass over its input channel); each is handled as its own `Submit`, and the
    endorsements they cause are signed together."""

    requests: tuple[ClientRequest, ...]


class EndorsementBatching(CoreParts):
    """`_seal` (see the module docstring)."""

    def _seal(self, out: Outbox) -> None:
        signed = self._kernel.seal()
        if not signed:
            return
        out.signed = True
        batch = batch_of(signed)
        self._recovery.sealed(batch)
        self._broadcast(batch, out)
        records = []
        for e in signed:
            record = self._store.get(e.tx_id)
            if record is not None and record.state is TxState.PENDING:
                record.endorsements[e.endorser] = e
                records.append(record)
        self._rules.invalidate()
        for record in records:
            self._try_commit(record, out)
