"""The backup file `phalanx snapshot save` writes and `phalanx snapshot restore` reads.

Owns: `BackupHeader`, `write_backup` and `read_backup`.

Layout (integers little-endian):
    b"PHXBAK01" | u32 header_len | header (UTF-8 JSON, sorted keys) |
    the checkpoint as a v2 checkpoint file (`phalanx.storage.checkpoint_v2`: its own CRC-32s
    over the metadata and the data, and an end marker) |
    SHA-256 of every byte before it (32) | b"PHXBEND1"
The header says where the state came from and what it is: the protocol and app, the
checkpoint's index and term, the node that wrote it and the cluster's identity (the CA
fingerprint, `phalanx.runtime.identity.cluster_fingerprint`), the voters then, when, the
data's length and SHA-256, and the node's settings a restore repeats.

Invariants: `read_backup` returns a checkpoint only when the end marker, the SHA-256 of the
whole file, the checkpoint's CRCs, the data's SHA-256 and length and the header's index all
check; otherwise `BackupFileError` says which failed, naming the file. Written to
``FILE.tmp``, fsynced, renamed: a crash never leaves a half-written FILE.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Final

from phalanx.storage.checkpoint_v2 import END2, TRAIL2, decode_checkpoint, encode_header2
from phalanx.storage.interface import StoredCheckpoint

MAGIC: Final = b"PHXBAK01"
END: Final = b"PHXBEND1"
FORMAT: Final = 1
_LEN = struct.Struct("<I")
_SLICE = 1 << 20


class BackupFileError(Exception):
    """A backup file that cannot be read or fails a check (the message names the file)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BackupHeader:
    protocol: str
    app: str
    index: int
    term: int
    node: str
    cluster: str
    """The source cluster's identity (its CA fingerprint)."""
    voters: tuple[str, ...]
    created: str
    """When the node wrote the checkpoint (ISO 8601, UTC)."""
    data_bytes: int
    data_sha256: str
    settings: dict[str, object] = field(default_factory=dict)
    """The source node's settings a restore repeats (`phalanx.ops.backup.node_settings`):
    fsync, timing, checkpoint interval, protocol options, services; {} if unknown."""
    format: int = FORMAT

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> BackupHeader:
        obj = json.loads(raw)
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise ValueError(f"format {obj.get('format') if isinstance(obj, dict) else obj!r}"
                             f" (this version reads {FORMAT})")
        obj["voters"] = tuple(obj["voters"])
        if not isinstance(obj.get("settings", {}), dict):
            raise ValueError("settings is not an object")
        return cls(**obj)


def write_backup(path: Path, header: BackupHeader, checkpoint: StoredCheckpoint) -> None:
    """Write `checkpoint` with `header` into `path` atomically (module docstring).
    Raises `OSError`."""
    head = header.encode()
    tmp = path.with_name(path.name + ".tmp")
    digest = hashlib.sha256()
    data = memoryview(checkpoint.data)
    with open(tmp, "wb") as f:
        def put(raw: bytes | memoryview) -> None:
            digest.update(raw)
            f.write(raw)

        put(MAGIC + _LEN.pack(len(head)) + head)
        put(encode_header2(checkpoint.index, checkpoint.meta))
        for at in range(0, len(data), _SLICE):
            put(data[at:at + _SLICE])
        put(TRAIL2.pack(len(data), zlib.crc32(data), END2))
        f.write(digest.digest() + END)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_backup(path: Path) -> tuple[BackupHeader, StoredCheckpoint]:
    """The header and checkpoint in backup file `path`. Raises `BackupFileError`."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise BackupFileError(f"cannot read {path}: {e.strerror or e}") from None
    if len(raw) < len(MAGIC) + _LEN.size + 40 or raw[:len(MAGIC)] != MAGIC:
        raise BackupFileError(f"{path} is not a phalanx backup (no {MAGIC.decode()} header)")
    if raw[-len(END):] != END:
        raise BackupFileError(f"{path} is cut short (no end marker): copy it again")
    body = memoryview(raw)[:-40]
    if hashlib.sha256(body).digest() != raw[-40:-8]:
        raise BackupFileError(f"{path} fails its SHA-256 checksum: the file is damaged")
    (head_len,) = _LEN.unpack_from(raw, len(MAGIC))
    at = len(MAGIC) + _LEN.size
    try:
        header = BackupHeader.decode(raw[at:at + head_len])
    except (ValueError, TypeError, KeyError) as e:
        raise BackupFileError(f"{path}: unreadable header ({e})") from None
    checkpoint = decode_checkpoint(bytes(body[at + head_len:]))
    if isinstance(checkpoint, str):
        raise BackupFileError(f"{path}: the checkpoint in it is invalid ({checkpoint})")
    if (checkpoint.index != header.index or len(checkpoint.data) != header.data_bytes
            or hashlib.sha256(checkpoint.data).hexdigest() != header.data_sha256):
        raise BackupFileError(f"{path}: the checkpoint does not match its header (index, "
                              "length or SHA-256)")
    return header, checkpoint
