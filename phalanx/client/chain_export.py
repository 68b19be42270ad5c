"""A chain as a file: `phalanx chain export` writes it, `phalanx chain validate` reads it.

Owns the export format, `fetch_chain`, `fetch_blocks` and `attach_certificates`:

    file  = magic "PHALANX-CHAIN-2\\n" | frame(genesis) | frame(block 1) | ... | frame(block n)
            | end
    frame = u32 big-endian length | codec bytes (`Genesis`, then `BlockData`s by height)
    end   = u32 0xFFFFFFFF | u64 big-endian n (the number of blocks)

`read_export` is strict (the magic, every frame complete and decoding to the right type,
the end mark naming as many blocks as were read, nothing after it) and raises
`ExportFormatError` naming what is wrong: a file cut at a frame boundary is refused, not
read as a shorter chain. Version-1 files ("PHALANX-CHAIN-1\\n", no end mark) are still
read; they cannot tell such a cut. Whether
the chain itself is valid is `phalanx.apps.chain.validate`'s question, not this module's.

Certificates: a block's header carries, in its `consensus_proof` (which its hash does not
cover), the block certificate the nodes' block-certifier service stored for it, when one
does (`attach_certificates`: asks the nodes in config order for the heights still lacking
one, keeps only certificates that verify against the cluster's node keys and quorum, so a
Byzantine node cannot slip a bad one into an export; blocks no node certified stay bare).

Must not import: the runtime, consensus cores.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from phalanx.apps.chain.types import REGISTRY, BlockData, Genesis, decode_genesis, encode
from phalanx.client.chain import ChainClient
from phalanx.net.codec import DecodeError
from phalanx.ops.node_config import ClusterConfig

MAGIC = b"PHALANX-CHAIN-2\n"
MAGIC_V1 = b"PHALANX-CHAIN-1\n"
"""The first format: no end mark (a cut at a frame boundary reads as a shorter chain)."""
END = b"\xff\xff\xff\xff"
"""The end mark's first 4 bytes (a length no frame may have: `MAX_FRAME` is far below)."""
MAX_FRAME = 64 << 20


class ExportFormatError(ValueError):
    """The file is not a chain export."""


async def fetch_chain(chain: ChainClient, *, upto: int | None = None, stale: bool = False,
                      parallel: int = 16) -> list[BlockData]:
    """Blocks 1..`upto` (default: the head) from the cluster, in order, `parallel` calls at
    a time. Raises the first `ClientError` a call raised (not an ExceptionGroup)."""
    head = upto if upto is not None else (await chain.head(stale=stale)).height
    return await fetch_blocks(chain, 1, head, stale=stale, parallel=parallel)


async def fetch_blocks(chain: ChainClient, first: int, last: int, *, stale: bool = False,
                       parallel: int = 16) -> list[BlockData]:
    """Blocks `first`..`last`, in order, `parallel` calls at a time. Raises the first
    `ClientError` a call raised (not an ExceptionGroup)."""
    import trio

    from phalanx.apps.chain.types import GetBlock
    from phalanx.client.errors import ClientError

    blocks: list[BlockData | None] = [None] * max(0, last - first + 1)
    errors: list[ClientError] = []
    limit = trio.CapacityLimiter(max(1, parallel))

    async def get(height: int) -> None:
        async with limit:
            if errors:
                return
            try:
                blocks[height - first] = await chain.query(GetBlock(height=height),
                                                           BlockData, stale=stale)
            except ClientError as e:
                errors.append(e)

    async with trio.open_nursery() as nursery:
        for h in range(first, last + 1):
            nursery.start_soon(get, h)
    if errors:
        raise errors[0]
    return [b for b in blocks if b is not None]


@dataclass(frozen=True, slots=True, kw_only=True)
class Certified:
    """`attach_certificates`' result."""

    blocks: list[BlockData]
    certified: int
    """Blocks that now carry a certificate that verifies."""
    refused: int
    """Certificates a node served that did not verify (or were for another block)."""
    unreachable: tuple[str, ...]
    """Nodes whose certificates could not be asked for (no answer, or an error answer:
    e.g. their block-certifier service is off)."""


async def attach_certificates(cluster: ClusterConfig, genesis: Genesis,
                              blocks: list[BlockData], *, seconds: float = 2.0) -> Certified:
    """`blocks` (from height 1, in order), each with the certificate a node stored for it
    attached to its header when one verifies (see the module docstring). A cluster whose
    config has no node keys (made before block certificates) gets its blocks back bare."""
    from phalanx.apps.chain.block import chain_id, decode_header, encode_header
    from phalanx.apps.chain.certificate import BlockCertificate, attach, verify_header
    from phalanx.client.chain_light import SERVICE, cluster_keys, cluster_quorum
    from phalanx.client.errors import ClientError
    from phalanx.client.service_calls import call_service
    from phalanx.services.block_cert_api import MAX_FETCH, CertificateBatch, CertificateFetch

    keys = cluster_keys(cluster)
    out = list(blocks)
    if keys is None or not blocks:
        return Certified(blocks=out, certified=0, refused=0, unreachable=())
    quorum, cid = cluster_quorum(cluster), chain_id(genesis)
    headers = [decode_header(b.header) for b in blocks]
    index = {h.height: i for i, h in enumerate(headers)}
    lacking = [h.height for h in headers if not h.consensus_proof]
    refused, unreachable = 0, []
    for node in cluster.nodes:
        todo, lacking = lacking, []
        for i in range(0, len(todo), MAX_FETCH):
            heights = tuple(todo[i:i + MAX_FETCH])
            try:
                answer = await call_service(cluster, node.id, SERVICE,
                                            CertificateFetch(heights=heights), seconds=seconds)
            except ClientError:
                unreachable.append(node.id)
                lacking.extend(todo[i:])
                break
            got = {c.height: c for c in (answer.certificates
                                         if isinstance(answer, CertificateBatch) else ())
                   if isinstance(c, BlockCertificate) and type(c.height) is int}
            for height in heights:
                cert, header = got.get(height), headers[index[height]]
                if cert is None:
                    lacking.append(height)
                    continue
                proofed = dataclasses.replace(header, consensus_proof=b"")
                with contextlib.suppress(ValueError):  # for another block: the node lied
                    proofed = attach(proofed, cert)
                if not verify_header(proofed, keys, quorum, chain_id=cid):
                    refused += 1
                    lacking.append(height)
                    continue
                headers[index[height]] = proofed
                out[index[height]] = dataclasses.replace(out[index[height]],
                                                         header=encode_header(proofed))
        if not lacking:
            break
    certified = sum(1 for h in headers if h.consensus_proof)
    return Certified(blocks=out, certified=certified, refused=refused,
                     unreachable=tuple(unreachable))


def _frame(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


def write_export(path: Path, genesis: Genesis, blocks: Sequence[BlockData]) -> None:
    """Write the export atomically (a temporary file renamed over `path`)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as f:
        f.write(MAGIC + _frame(encode(genesis)))
        for block in blocks:
            f.write(_frame(REGISTRY.encode(block)))
        f.write(END + len(blocks).to_bytes(8, "big"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_export(path: Path) -> tuple[Genesis, list[BlockData]]:
    """The genesis and blocks in `path`. Raises `ExportFormatError` (or OSError)."""
    data = path.read_bytes()
    marked = data.startswith(MAGIC)
    if not marked and not data.startswith(MAGIC_V1):
        raise ExportFormatError(f"{path}: not a phalanx chain export (bad magic)")
    pos = len(MAGIC)
    frames: list[bytes] = []
    ended = False
    while pos < len(data):
        if pos + 4 > len(data):
            raise ExportFormatError(f"{path}: truncated frame header at byte {pos}")
        if marked and data[pos:pos + 4] == END:
            if pos + 12 != len(data):
                raise ExportFormatError(
                    f"{path}: truncated end mark or bytes after it at byte {pos}")
            count = int.from_bytes(data[pos + 4:pos + 12], "big")
            if count != len(frames) - 1:
                raise ExportFormatError(
                    f"{path}: the end mark names {count} blocks, the file holds {len(frames) - 1}")
            ended = True
            break
        size = int.from_bytes(data[pos:pos + 4], "big")
        if size > MAX_FRAME or pos + 4 + size > len(data):
            raise ExportFormatError(f"{path}: truncated or oversized frame at byte {pos}")
        frames.append(data[pos + 4:pos + 4 + size])
        pos += 4 + size
    if marked and not ended:
        raise ExportFormatError(f"{path}: truncated: no end mark (the file was cut short)")
    if not frames:
        raise ExportFormatError(f"{path}: no genesis")
    try:
        genesis = decode_genesis(frames[0])
        blocks = [REGISTRY.decode(f, expected=BlockData) for f in frames[1:]]
    except (DecodeError, ValueError) as e:
        raise ExportFormatError(f"{path}: {e}") from None
    return genesis, blocks
