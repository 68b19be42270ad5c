"""The replica's session table, bounded: client sessions expire deterministically.

Owns: `SessionTable`, the deduplication records of the replica layer (Raft dissertation
§6.3): per client id its latest applied request number, the cached reply and the applied
index at which it last ran (`Session.last_index`), plus TOMBSTONES of expired sessions
(client id -> its last request number, no reply). Part of every checkpoint
(`phalanx.apps.envelope`, format version 2).

Expiry (replicated state, decided at apply time only, so every replica decides alike):
- After each applied entry, while more than `max_sessions` sessions are live, the one with
  the smallest ``(last_index, client_id)`` expires: it becomes a tombstone. Tombstones are
  bounded the same way (`max_sessions`), oldest dropped first.
- Window: a session is kept until `max_sessions` other clients have written since its last
  write, and its tombstone about as long again. A retry within the window is answered from
  the cache (or refused as expired: never applied twice). A retry of an old request after
  BOTH windows can run again: a client must not retry for that long.
- A write of client c with request number n: c live -> the usual rule (n new runs, n equal
  gets the cached reply, n older is `EXPIRED`); c a tombstone with number t -> n <= t is
  `SESSION_EXPIRED` (not run: its reply is gone, it may have run), n > t runs and revives the
  session; c unknown -> runs.
- A checkpoint of format version 1 (no `last_index`) loads its sessions with last_index 0.
  A replica restored from such a checkpoint may therefore order the pre-upgrade sessions
  differently from one that applied their entries live; the orders agree again once every
  pre-upgrade session was written once more or expired.

Must not import: consensus cores, storage, trio, clocks. Deterministic: nothing depends on
set order, `id()` or time.
"""

from __future__ import annotations

import enum

import immutables

from phalanx.apps.envelope import Session, Sessions

DEFAULT_MAX_SESSIONS = 100_000
"""Live sessions kept (~0.3 KiB each with a small reply), and as many tombstones."""


class Verdict(enum.Enum):
    RUN = "run"
    DUPLICATE = "duplicate"
    EXPIRED = "expired"
    SESSION_EXPIRED = "session_expired"


class SessionTable:
    """See the module docstring. `sessions` and `tombstones` are persistent maps (an O(1)
    snapshot for checkpoints); the two order dicts are derived from them."""

    def __init__(self, *, max_sessions: int = DEFAULT_MAX_SESSIONS) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        self.max_sessions = max_sessions
        self.sessions: Sessions = immutables.Map()
        self.tombstones: Sessions = immutables.Map()
        self.expired = 0
        """Sessions expired into tombstones by this replica (not replicated; statistics)."""
        self._order: dict[str, None] = {}
        """Live client ids by ascending (last_index, client_id)."""
        self._tomb_order: dict[str, None] = {}
        self._touched: list[str] = []

    def __len__(self) -> int:
        return len(self.sessions)

    def get(self, client_id: str) -> Session | None:
        return self.sessions.get(client_id)

    def verdict(self, client_id: str, request_no: int) -> tuple[Verdict, Session | None]:
        """What the rule says of write (client_id, request_no) (see the module docstring)."""
        session = self.sessions.get(client_id)
        if session is None:
            tomb = self.tombstones.get(client_id)
            if tomb is not None and request_no <= tomb.request_no:
                return Verdict.SESSION_EXPIRED, None
            return Verdict.RUN, None
        if request_no == session.request_no:
            return Verdict.DUPLICATE, session
        if request_no < session.request_no:
            return Verdict.EXPIRED, session
        return Verdict.RUN, session

    def record(self, client_id: str, request_no: int, result: bytes, index: int) -> None:
        """A write ran at `index`: it becomes the client's session."""
        self.sessions = self.sessions.set(
            client_id, Session(request_no=request_no, result=result, last_index=index))
        if client_id in self.tombstones:
            self.tombstones = self.tombstones.delete(client_id)
            del self._tomb_order[client_id]
        self._touched.append(client_id)

    def end_entry(self) -> None:
        """After an entry's requests: order this entry's sessions last, then expire."""
        touched = self._touched
        if touched:
            order = self._order
            for client_id in sorted(set(touched)) if len(touched) > 1 else touched:
                order.pop(client_id, None)
                order[client_id] = None
            touched.clear()
        if len(self.sessions) > self.max_sessions:
            self._expire()

    def _expire(self) -> None:
        order, tomb_order = self._order, self._tomb_order
        sessions, tombs = self.sessions.mutate(), self.tombstones.mutate()
        while len(sessions) > self.max_sessions:
            client_id = next(iter(order))
            del order[client_id]
            session = sessions.pop(client_id)
            tombs[client_id] = Session(request_no=session.request_no, result=b"",
                                       last_index=session.last_index)
            tomb_order[client_id] = None
            self.expired += 1
        while len(tombs) > self.max_sessions:
            client_id = next(iter(tomb_order))
            del tomb_order[client_id]
            del tombs[client_id]
        self.sessions, self.tombstones = sessions.finish(), tombs.finish()

    def load(self, sessions: Sessions, tombstones: Sessions) -> None:
        """Replace the table with a checkpoint's (then expire down to `max_sessions`)."""
        self.sessions, self.tombstones = sessions, tombstones
        self._order = _ordered(sessions)
        self._tomb_order = _ordered(tombstones)
        self._touched.clear()
        if len(sessions) > self.max_sessions or len(tombstones) > self.max_sessions:
            self._expire()


def _ordered(sessions: Sessions) -> dict[str, None]:
    return dict.fromkeys(sorted(sessions.keys(),
                                key=lambda cid: (sessions[cid].last_index, cid)))
