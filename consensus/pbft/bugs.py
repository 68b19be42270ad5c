"""Deliberate PBFT bugs, for mutation tests: the simulator sweep and targeted tests switch one
on to prove their checkers catch it.

Owns: `PbftBugs`, the one object that carries the switches into a replica
(`PbftCore(..., bugs=...)`; the default is `NO_BUGS`), the switch names the simulator's
``--bug`` accepts (`KNOWN_BUGS`), and the two mutated parts the core swaps in when a switch
asks for one (`UnfencedSafetyRules`, `SkipViewChangeSignatures`). Only `core.py` reads the
switches; the sub-machines, `safety.py` and `view_change.py` state the honest protocol.

Invariant: `NO_BUGS` (every switch off) is the protocol; a config never carries bugs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields

from phalanx.consensus.crypto import Signer
from phalanx.consensus.pbft.messages import SafetyData, ViewChange
from phalanx.consensus.pbft.safety import SafetyRules
from phalanx.consensus.pbft.view_change import CheckCrypto
from phalanx.consensus.types import NodeId


@dataclass(frozen=True, slots=True, kw_only=True)
class PbftBugs:
    """Which deliberate bugs a replica runs with (all off by default).

    Attributes:
        commit_on_2f: commit on 2f matching commits instead of 2f+1.
        skip_view_check: accept pre-prepares, prepares and commits of another view.
        accept_unsigned_view_change: skip signature checks on ViewChange messages
            (received directly or inside a NewView).
        no_view_fence: a restarted replica forgets the fence (`safety.SafetyRules`): it
            signs pre-prepares and prepares again in the views where it may have sent some
            early, before they were durable, so it can equivocate.
    """

    commit_on_2f: bool = False
    skip_view_check: bool = False
    accept_unsigned_view_change: bool = False
    no_view_fence: bool = False

    @classmethod
    def from_names(cls, names: Iterable[str]) -> PbftBugs:
        """The switches named (the simulator's ``--bug`` names); an unknown name raises
        `ValueError` naming the known ones."""
        wanted = frozenset(names)
        unknown = sorted(wanted - KNOWN_BUGS)
        if unknown:
            raise ValueError(f"unknown PBFT bug switch(es) {unknown}; known: {sorted(KNOWN_BUGS)}")
        return cls(**{name: True for name in wanted})

    @property
    def names(self) -> frozenset[str]:
        """The names of the switches that are on."""
        return frozenset(f.name for f in fields(self) if getattr(self, f.name))


KNOWN_BUGS = frozenset(f.name for f in fields(PbftBugs))
"""The names `PbftBugs.from_names` accepts (its field names)."""

NO_BUGS = PbftBugs()


class UnfencedSafetyRules(SafetyRules):
    """The ``no_view_fence`` bug: `SafetyRules` that start with no restart fence, so a
    restarted replica signs pre-prepares and prepares again in the views where votes it
    sent early may have died with the process (the simulator and a targeted test must catch
    the equivocation this allows)."""

    __slots__ = ()

    def __init__(self, signer: Signer, data: SafetyData | None = None) -> None:
        super().__init__(signer, data)
        self._fence = -1


class SkipViewChangeSignatures:
    """The ``accept_unsigned_view_change`` bug: a verifier that takes any `ViewChange`'s
    signature as good (received directly or inside a NewView) and checks everything else
    with the real one."""

    __slots__ = ("_crypto",)

    def __init__(self, crypto: CheckCrypto) -> None:
        self._crypto = crypto

    def verify(self, node: NodeId, obj: object, signature: bytes) -> bool:
        return isinstance(obj, ViewChange) or self._crypto.verify(node, obj, signature)

    def digest(self, data: bytes) -> bytes:
        return self._crypto.digest(data)

    def encode(self, obj: object) -> bytes:
        return self._crypto.encode(obj)
