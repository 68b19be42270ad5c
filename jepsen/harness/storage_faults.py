"""Storage faults on a stopped node's data directory: a torn WAL tail, a flipped checkpoint bit.

Owns `tear_wal_tail(data_dir, rng)` and `flip_checkpoint_bit(data_dir, rng)`, each returning
a one-line description of what it did (for the history's nemesis ops).

Both work on the file layout of `phalanx.storage` (``wal-<first>.seg`` segments and
``checkpoint-<index>.ckpt`` files, flat in the node's data directory) but import nothing from
it: they damage bytes the way a crash or a bad disk does, and the node's own recovery must
cope. The node must not be running (the caller killed it).

* A torn tail is what a crash in the middle of an append leaves: the file ends inside a
  record header. We append 1..19 non-zero bytes (a header is 20 bytes) to the newest
  segment; acknowledged (complete) records are never touched, so recovery may, and must,
  cut exactly these bytes off.
* A flipped bit in the newest checkpoint's payload (past its 32-byte header, so it is the
  checksum that must catch it): recovery must skip that checkpoint, report it, and restore
  from an older one or from its peers.

Must not import the runtime or consensus cores. Seeded by the caller's `random.Random`.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Final

WAL_GLOB: Final = "wal-*.seg"
CHECKPOINT_GLOB: Final = "checkpoint-*.ckpt"
RECORD_HEADER_BYTES: Final = 20
CHECKPOINT_HEADER_BYTES: Final = 32


def _newest(data_dir: Path, pattern: str) -> Path | None:
    files = sorted(data_dir.glob(pattern))  # zero-padded indexes: name order is index order
    return files[-1] if files else None


def tear_wal_tail(data_dir: Path, rng: random.Random) -> str:
    """Append a partial record header to the newest WAL segment (module docstring)."""
    segment = _newest(data_dir, WAL_GLOB)
    if segment is None:
        return "no WAL segment to tear"
    n = rng.randint(1, RECORD_HEADER_BYTES - 1)
    torn = bytes(rng.randint(1, 255) for _ in range(n))
    with segment.open("ab") as f:
        f.write(torn)
        f.flush()
        os.fsync(f.fileno())
    return f"tore {segment.name}: +{n} bytes"


def flip_checkpoint_bit(data_dir: Path, rng: random.Random) -> str:
    """Flip one bit in the newest checkpoint's body (module docstring)."""
    checkpoint = _newest(data_dir, CHECKPOINT_GLOB)
    if checkpoint is None:
        return "no checkpoint to flip"
    size = checkpoint.stat().st_size
    if size <= CHECKPOINT_HEADER_BYTES:
        offset = rng.randrange(size) if size else 0
    else:
        offset = rng.randrange(CHECKPOINT_HEADER_BYTES, size)
    if size == 0:
        return f"{checkpoint.name} is empty"
    bit = rng.randrange(8)
    with checkpoint.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))
        f.flush()
        os.fsync(f.fileno())
    return f"flipped bit {bit} of byte {offset} in {checkpoint.name}"
