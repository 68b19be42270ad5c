"""Property 3 of the conformance suite: determinism. For every subject and every node of a
recorded run (lossy, duplicating links, so inputs interleave irregularly), two fresh cores,
built from fresh setups with the same construction arguments (the same random generator
state), fed the node's recorded input sequence give byte-identical outputs, Ready by Ready
(`core_replay.ready_bytes`: messages and records through the codec), and identical to what
the recorded core itself output."""

from __future__ import annotations

import pytest
from core_replay import recorded, replay
from subjects import IDS, SUBJECTS, Subject


@pytest.mark.parametrize("subject", SUBJECTS, ids=IDS)
def test_same_inputs_same_bytes(subject: Subject) -> None:
    for rec in recorded(subject.name, 7):
        assert len(rec.inputs) > 100, rec.node  # a real run, not a boot
        first, second = replay(rec), replay(rec)
        assert first == second, rec.node
        diverged = next((i for i, (a, b) in enumerate(zip(first, rec.outputs, strict=True))
                         if a != b), None)
        assert diverged is None, f"{rec.node}: step {diverged} ({rec.inputs[diverged]!r})"
