"""What the leaderless core sees of the application: `AppView`.

Owns: the `AppView` protocol, the only way the leaderless core reads application state
(PnyxDB's endorsement checks need local versions, conflicts and the local policy vote; the
version gate needs to know when what it released was applied). The runtime and the
simulator build one over the replica's state machine and its `EndorsementHooks`
(`phalanx.protocols.leaderless_node.ReplicaAppView`); unit tests use a small fake.

Must not import: `phalanx.apps` (the adapter lives with the runtime half), `phalanx.net`,
trio, clocks, random.

Rules for the core:
- `access_of(command)` is a pure function of the command: compute it once per transaction.
- `versions` and `accepts` read the state AS APPLIED SO FAR (`applied()` entries released by
  this core were applied; later ones may still be on their way through the driver). A
  requirement check that must be exact (the version gate before release) first waits until
  no released-but-unapplied transaction writes one of the keys it reads.
- None of them raises; none changes state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class AppView(Protocol):
    def conflicts(self, a: bytes, b: bytes) -> bool:
        """Whether commands `a` and `b` conflict (one writes what the other reads or writes,
        unless they only apply commuting updates to it). Symmetric, pure."""
        ...

    def keys(self, command: bytes) -> tuple[str, ...] | None:
        """Every key `command` reads or writes, or None when it touches key ranges (a scan).
        Two commands whose keys are known and disjoint never conflict (`conflicts` is
        False): the endorsement rule looks for conflicts only among those sharing a key.
        Pure."""
        ...

    def writes(self, command: bytes) -> tuple[str, ...]:
        """The keys `command` may write (sorted). Pure."""
        ...

    def needs_requirements(self, command: bytes) -> tuple[str, ...]:
        """The keys `command` reads, or writes by an update that does not commute with every
        other (a `set`, a `concat`...), sorted. A transaction must carry a requirement on
        each: a correct node never endorses one that lacks it (a blind overwrite could apply
        in different orders on different replicas). Pure."""
        ...

    def accepts(self, command: bytes, policy: str) -> bool:
        """This node's local vote (the application policy `policy`): False = never endorse."""
        ...

    def versions(self, keys: Sequence[str]) -> tuple[bytes, ...]:
        """The current version of each key (b"" when absent), as applied so far."""
        ...

    def base_versions(self, keys: Sequence[str]) -> tuple[bytes, ...]:
        """The current BASE version of each key, as applied so far: unchanged by the
        commuting updates (`needs_base`), changed by every other write to a value it never
        had before (so a requirement on it can never hold again after the next such write),
        and equal on replicas that applied the same transactions, in whatever order."""
        ...

    def needs_base(self, command: bytes) -> tuple[str, ...]:
        """The keys `command` writes only through commuting updates (sorted): a transaction
        must carry a requirement on each (on its base version, or its full version). An
        app that cannot order them returns () (its updates then carry none: see the known
        limit in docs/LEADERLESS.md). Pure."""
        ...

    def fits_run(self, command: bytes, keys: Sequence[str]) -> bool:
        """Whether `command`'s commuting updates of `keys` commute with every update the
        app applied on those keys' current bases (as applied so far). The endorsement rule
        asks it for the keys a transaction requires only by BASE version: an update that
        would switch the kind of a key's run (add after mul, srem of a member added on this
        base) must require the full version (it then counts as a write that moves the base).
        A local vote, like `accepts`; an app without base versions answers True."""
        ...

    def applied(self) -> int:
        """How many of the entries this core released (`Ready.committed`, local index
        order) the replica has applied: the applied index."""
        ...

    def applied_within(self, max_deadline_ms: int) -> list[bytes]:
        """The ids in the replica's transaction table (the writing transactions it applied
        and still records, an installed checkpoint's included) that a table whose newest
        deadline is `max_deadline_ms` keeps too (deadline >= `max_deadline_ms` minus the
        table's horizon), sorted. [] when the replica keeps no table. State transfer's
        coverage rule (`state_transfer.py`) reads it."""
        ...
