"""One run's memo of `FastCrypto`'s pure functions, shared by every simulated node.

Owns: `CryptoMemo`, which `phalanx.consensus.crypto.FastCrypto` takes as its `memo`: the
bytes a tag covers (`signing_view` then the encoding), the tags made over them with a key,
and the plain encoding of an object (what `digest_of` hashes), remembered per object.

Why: over a WAN at n = 180 the same message object reaches many replicas (the network
memoises decoding by bytes, so the 179 copies of a signed broadcast decode to one object)
and each verifies it with the signer's key: before this memo every one of them re-built the
signing view and its `repr` (a ViewChange with its prepared certificates is ~100s of KB of
text), and a sender re-encoded one commit for each of its n-1 MACs. Profiles: docs/SCALE.md
"Simulator speed at scale".

Invariants:
- Transparent: every value returned is the one the uncached computation returns for the
  same object (objects are frozen: their value never changes), so a run's behaviour, its
  trace and its hash are the same with or without the memo. Nothing here decides anything.
- Keyed by identity, never by value (hashing a large frozen dataclass costs about as much as
  encoding it): an entry keeps a strong reference to its object, so while the entry lives
  no other object can have that `id`, and a lookup also checks ``entry[0] is obj``.
  One exception, `tag_by_value` (MAC checks): a MAC'd message is one object per receiver
  (its bytes differ in their tag), met once, but a sender's n-1 copies have equal signing
  views; there the covered bytes are kept by the view's value, for flat messages only
  (a dataclass whose kept fields are all exactly `int`, `str` or `bytes`: cheap to hash,
  and equal values of those types have equal encodings: no ``1 == True``); anything else
  is encoded as without the memo. The tags of MAC checks are not kept.
- Bounded: at most `max_entries` entries and `max_bytes` bytes of encodings; the memo is
  cleared when either is passed (as the network's decode memo is); the by-value part
  likewise, on its own count of entries and bytes.
- Per run (built by a protocol's setup), never global: runs do not share state.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from operator import attrgetter

from phalanx.consensus.crypto import repr_encoding, signing_view, uncovered_fields

_FLAT = frozenset({int, str, bytes})
"""The exact types whose equal values have equal encodings and cheap hashes (`tag_by_value`):
not `bool` (``True == 1``, different `repr`), not subclasses, not containers."""


class _Entry:
    __slots__ = ("covered", "digest", "encoded", "obj", "tags")

    def __init__(self, obj: object) -> None:
        self.obj = obj
        self.covered: bytes | None = None
        self.encoded: bytes | None = None
        self.tags: dict[bytes, bytes] = {}
        self.digest: bytes | None = None


class CryptoMemo:
    """See the module docstring. `hits` and `misses` count `tag` lookups (a report's)."""

    __slots__ = ("_bytes", "_encode", "_entries", "_flat", "_view_bytes", "_views", "encoding",
                 "hits", "max_bytes", "max_entries", "misses")

    def __init__(self, *, encode: Callable[[object], bytes] = repr_encoding,
                 max_entries: int = 65_536, max_bytes: int = 256 << 20) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError(f"max_entries and max_bytes must be >= 1, got {max_entries}, "
                             f"{max_bytes}")
        self._encode = encode
        self.encoding = encode
        self._entries: dict[int, _Entry] = {}
        self._bytes = 0
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0
        self._flat: dict[type, Callable[[object], tuple[object, ...]] | None] = {}
        """Per type, the getter of the fields its signing view keeps (None: not by value)."""
        self._views: dict[tuple[type, tuple[object, ...]], bytes] = {}
        """The covered bytes of flat signing views, by (type, kept field values)."""
        self._view_bytes = 0

    def _entry(self, obj: object) -> _Entry:
        entry = self._entries.get(id(obj))
        if entry is None or entry.obj is not obj:
            entries = self._entries
            if len(entries) >= self.max_entries or self._bytes > self.max_bytes:
                entries.clear()
                self._bytes = 0
            entry = entries[id(obj)] = _Entry(obj)
        return entry

    def tag(self, key: bytes, obj: object) -> bytes:
        """`blake2b(encode(signing_view(obj)), key=key)`, as `FastCrypto` computes it."""
        entry = self._entries.get(id(obj))  # (`_entry`, inlined for the common hit)
        if entry is None or entry.obj is not obj:
            entry = self._entry(obj)
        tag = entry.tags.get(key)
        if tag is not None:
            self.hits += 1
            return tag
        self.misses += 1
        data = entry.covered
        if data is None:
            data = entry.covered = self._encode(signing_view(obj))
            self._bytes += len(data)
        tag = entry.tags[key] = hashlib.blake2b(data, key=key, digest_size=32).digest()
        return tag

    def tag_by_value(self, key: bytes, obj: object) -> bytes:
        """`blake2b(encode(signing_view(obj)), key=key)`, as `FastCrypto` computes it, with
        the covered bytes of a flat message remembered by value (module docstring)."""
        cls = type(obj)
        try:
            kept = self._flat[cls]
        except KeyError:
            names = uncovered_fields(cls)
            # (attrgetter of one name returns the value, not a 1-tuple: not by value)
            kept = self._flat[cls] = attrgetter(*names) if len(names) >= 2 else None
        if kept is not None:
            values = kept(obj)
            if _FLAT.issuperset(map(type, values)):
                views = self._views
                view = (cls, values)
                data = views.get(view)
                if data is None:
                    data = self._encode(signing_view(obj))
                    if len(views) >= self.max_entries or self._view_bytes > self.max_bytes:
                        views.clear()
                        self._view_bytes = 0
                    views[view] = data
                    self._view_bytes += len(data)
                return hashlib.blake2b(data, key=key, digest_size=32).digest()
        data = self._encode(signing_view(obj))
        return hashlib.blake2b(data, key=key, digest_size=32).digest()

    def encode(self, obj: object) -> bytes:
        """`encode(obj)` (the bytes `digest_of` hashes)."""
        entry = self._entry(obj)
        data = entry.encoded
        if data is None:
            data = entry.encoded = self._encode(obj)
            self._bytes += len(data)
        return data

    def digest(self, data: bytes) -> bytes:
        """`blake2b(data)`, remembered for a large `data` object (by identity: the bytes
        this memo's `encode` returned come back as the same object)."""
        entry = self._entries.get(id(data))
        if entry is not None and entry.obj is data and entry.digest is not None:
            return entry.digest
        d = hashlib.blake2b(data, digest_size=32).digest()
        if len(data) >= 1024:  # small ones cost less to hash than to remember
            self._entry(data).digest = d
        return d
