"""Which replicas of a real Byzantine-tolerant cluster (PBFT, leaderless) are Byzantine, and
how: ``--byzantine SPEC``.

Owns:
    `TWINS`, `parse_byzantine` (the option's grammar), `plan_byzantine` (placing the modes on
    nodes, seeded, and refusing more than f liars unless the run is a control) and
    `ByzantinePlan` (the resolved plan, as the runner, the cluster and the store see it).

Grammar: ``SPEC`` is a comma-separated list of items; each item makes one more replica
Byzantine for the whole run (from its first start, across restarts):

    * ``MODE``: one of the protocol's `ProtocolSpec.byzantine_modes` (PBFT:
      `phalanx.jepsen.byzantine.BEHAVIOURS`, ``equivocate``, ``silent``, ``corrupt_reply``,
      ...; leaderless: `phalanx.jepsen.leaderless_byzantine.LEADERLESS_BEHAVIOURS`,
      ``equivocate``, ``lie_versions``, ``forge_veto``, ...; ``corrupt-reply`` is accepted
      for ``corrupt_reply``). The
      replica runs ``phalanx node run --byzantine MODE``: the same wrapper, under the same
      name, that ``phalanx sim --protocol pbft --byzantine K`` draws its liars' behaviours
      from.
    * ``twins``: the replica is twinned: two processes share its identity, certificate and
      signing key, each talking to its own side of the honest replicas (``phalanx sim
      --twins T``; see `phalanx.jepsen.harness.cluster`).
    * ``any``: one replica whose mode the seed draws from the behaviours; a number ``K``
      means ``K`` such items, so ``--byzantine 1`` reads as ``phalanx sim --byzantine 1``
      does (one seeded liar; the runtime takes one behaviour per replica, where the
      simulator may draw two).
    * ``NODE=MODE`` / ``NODE=twins`` / ``NODE=any``: the same, on that node (``n1`` is the
      primary of view 0, the one an ``equivocate`` replica needs to be to act at once).
      Unpinned items go to nodes drawn from the run's seed.

Validity: n = 3f+1 replicas tolerate f Byzantine ones. A plan with more than f (twins count
one each: one identity, one key) is refused with `ByzantinePlanError` unless
``allow_violation`` (the CLI's ``--expect-violation``): such a run is a control that may
legitimately end invalid. Twin sides: the honest replicas are shuffled by the seed and the
first half (rounded up) is side A, the rest side B (as `phalanx.jepsen.sim.pbft`).

Rules: pure and seeded (`random.Random` from the seed, no global random, sorted
iteration). Uses only the behaviour names (the specs' `byzantine_modes`, so `phalanx
jepsen`'s parser stays cheap); must not import the runtime, the simulator or the consensus
cores.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from phalanx.jepsen.nemesis import BYZANTINE_BEHAVIOURS as BEHAVIOURS
from phalanx.protocols import get as get_protocol
from phalanx.protocols import specs as protocol_specs

TWINS: Final = "twins"
ANY: Final = "any"
MODES: Final[tuple[str, ...]] = tuple(dict.fromkeys(
    [*BEHAVIOURS, *(m for s in protocol_specs() for m in s.byzantine_modes), TWINS, ANY]))
"""Everything an item may name: every protocol's Byzantine modes, ``twins``, ``any``
(`plan_byzantine` checks a mode against the run's protocol)."""


class ByzantinePlanError(ValueError):
    """A malformed ``--byzantine`` spec or a plan this cluster cannot (or must not) run."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ByzantineItem:
    """One parsed item: a mode and, if pinned, its node."""

    mode: str
    node: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ByzantinePlan:
    """The Byzantine replicas of one run.

    Attributes:
        modes: ``(node, mode)`` per replica running ``--byzantine MODE``, sorted by node.
        twins: the twinned nodes, sorted.
        side_a: the honest replicas twin A of every twinned node talks to (twin B talks to
            the other honest replicas); empty without twins.
        allow_violation: more than f Byzantine replicas were asked for on purpose.
    """

    modes: tuple[tuple[str, str], ...] = ()
    twins: tuple[str, ...] = ()
    side_a: tuple[str, ...] = ()
    allow_violation: bool = False

    @property
    def nodes(self) -> tuple[str, ...]:
        """Every Byzantine node, sorted."""
        return tuple(sorted({n for n, _ in self.modes} | set(self.twins)))

    def mode_of(self, node: str) -> str | None:
        """The ``--byzantine`` mode `node` runs (None: honest, or a twin)."""
        return dict(self.modes).get(node)

    def honest(self, names: Sequence[str]) -> tuple[str, ...]:
        bad = set(self.nodes)
        return tuple(n for n in sorted(names) if n not in bad)

    def side_b(self, names: Sequence[str]) -> tuple[str, ...]:
        """The honest replicas the B twins talk to."""
        if not self.twins:
            return ()
        return tuple(n for n in self.honest(names) if n not in self.side_a)

    def describe(self) -> str:
        parts = [f"{n} runs {m}" for n, m in self.modes]
        if self.twins:
            parts.append(f"twins {','.join(self.twins)} (side A: {','.join(self.side_a)})")
        return "; ".join(parts) or "none"

    def label(self) -> str:
        """A short test-name part: ``byz-equivocate``, ``byz-twins+silent``, ..."""
        kinds = sorted([m for _, m in self.modes] + [TWINS] * len(self.twins))
        return "byz-" + "+".join(k.replace("_", "-") for k in kinds) if kinds else ""

    def to_json(self) -> dict[str, object]:
        return {"nodes": list(self.nodes), "modes": {n: m for n, m in self.modes},
                "twins": list(self.twins), "side_a": list(self.side_a),
                "allow_violation": self.allow_violation, "description": self.describe()}


def _mode(text: str) -> str:
    mode = text.strip().replace("-", "_")
    if mode not in MODES:
        raise ByzantinePlanError(
            f"unknown Byzantine mode {text.strip()!r}; choose from {', '.join(MODES)}")
    return mode


def parse_byzantine(spec: str) -> tuple[ByzantineItem, ...]:
    """``MODE[,NODE=MODE,...]`` → items (module docstring); ``""`` / ``none``: no items."""
    spec = spec.strip()
    if spec in ("", "none"):
        return ()
    items: list[ByzantineItem] = []
    for raw in spec.split(","):
        if not raw.strip():
            raise ByzantinePlanError(f"empty item in --byzantine {spec!r}")
        node, sep, mode = raw.partition("=")
        if not sep and raw.strip().isdigit():
            items.extend(ByzantineItem(mode=ANY) for _ in range(int(raw.strip())))
            continue
        if sep:
            if not node.strip():
                raise ByzantinePlanError(f"no node before '=' in {raw.strip()!r}")
            items.append(ByzantineItem(mode=_mode(mode), node=node.strip()))
        else:
            items.append(ByzantineItem(mode=_mode(raw)))
    return tuple(items)


def format_items(items: Sequence[ByzantineItem]) -> str:
    """The canonical spec text of `items` (what test.json records)."""
    return ",".join(f"{i.node}={i.mode}" if i.node else i.mode for i in items)


def plan_byzantine(
    items: Sequence[ByzantineItem],
    names: Sequence[str],
    *,
    protocol: str,
    seed: int,
    allow_violation: bool = False,
) -> ByzantinePlan:
    """Place `items` on `names` (module docstring). Raises `ByzantinePlanError`."""
    if not items:
        return ByzantinePlan(allow_violation=allow_violation)  # "0" and "none" too
    spec = get_protocol(protocol)
    if spec.byzantine is None:
        able = [s.name for s in protocol_specs() if s.byzantine is not None]
        raise ByzantinePlanError(f"--byzantine needs a protocol that tolerates Byzantine "
                                 f"replicas, --protocol {' or '.join(able)} (got {protocol})")
    nodes = sorted(names)
    f = spec.max_faults(len(nodes))
    if len(items) > f and not allow_violation:
        raise ByzantinePlanError(
            f"{len(items)} Byzantine replicas exceed f={f} for n={len(nodes)}: the run could "
            "not be valid; pass --expect-violation to run it as a control")
    if len(items) >= len(nodes):
        raise ByzantinePlanError(
            f"{len(items)} Byzantine replicas leave no honest one among {len(nodes)}")
    allowed = (*spec.byzantine_modes, TWINS, ANY)
    for item in items:
        if item.mode not in allowed:
            raise ByzantinePlanError(
                f"{protocol} has no Byzantine mode {item.mode!r}; choose from "
                f"{', '.join(allowed)}")
    pinned: dict[str, str] = {}
    for item in items:
        if item.node is None:
            continue
        if item.node not in nodes:
            raise ByzantinePlanError(f"no node {item.node!r} (nodes: {', '.join(nodes)})")
        if item.node in pinned:
            raise ByzantinePlanError(f"{item.node} is named twice in --byzantine")
        pinned[item.node] = item.mode
    rng = random.Random(f"jepsen-byzantine:{seed}")
    free = [n for n in nodes if n not in pinned]
    rng.shuffle(free)
    placed = dict(pinned)
    for item in items:
        if item.node is None:
            placed[free.pop()] = item.mode
    for node in sorted(placed):
        if placed[node] == ANY:
            placed[node] = rng.choice(spec.byzantine_modes)
    twins = tuple(sorted(n for n, m in placed.items() if m == TWINS))
    modes = tuple(sorted((n, m) for n, m in placed.items() if m != TWINS))
    side_a: tuple[str, ...] = ()
    if twins:
        honest = [n for n in nodes if n not in placed]
        rng.shuffle(honest)
        side_a = tuple(sorted(honest[: (len(honest) + 1) // 2]))
    return ByzantinePlan(modes=modes, twins=twins, side_a=side_a,
                         allow_violation=allow_violation)
