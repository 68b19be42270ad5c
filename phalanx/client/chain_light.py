"""The chain's light client over a real cluster: an account's state verified against a
block header the client trusts, with the proof from ONE possibly Byzantine replica.

Owns: `verify_from_replica` (the `phalanx chain verify` flow), `certified_header` (a
replica's header with the block certificate it stored attached), `certificate_check` (THE
certificate verdict), `CertificateView` (what `phalanx chain block` shows),
`agreed_header` (the header f+1 replicas report identically, the fallback) and
`one_node` / `on_node` (calls to a single replica).

Trust: a header is trusted when its `consensus_proof` is a `BlockCertificate` of at least
`certificate_quorum` of the cluster's node keys (``signing_public_key`` of each node in
cluster.toml; n - f signatures under Byzantine faults, a majority under crash faults, from
the protocol registry's fault model; see `phalanx.apps.chain.certificate` for what each
proves). The certificate comes from the same single replica (its block-certifier service,
`CertificateQuery`). A certificate that does not verify refuses the header outright (the
replica lied). Only when the replica has no certificate for that height (its service is
off, the cluster predates it, or the signatures are still in flight) does the client fall
back to f+1 distinct replicas reporting byte-identical headers, and says so.

Must not import: the runtime, consensus cores.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

import trio

from phalanx.apps.chain.block import BlockHeader, chain_id, encode_header
from phalanx.apps.chain.certificate import (
    BlockCertificate,
    certificate_of,
    encode_certificate,
    verify_header,
)
from phalanx.apps.chain.light import verify_account
from phalanx.apps.chain.types import AccountProof, Genesis
from phalanx.client.async_client import open_client
from phalanx.client.chain import ChainClient
from phalanx.client.errors import ClientError
from phalanx.ops import pki
from phalanx.ops.node_config import ClusterConfig
from phalanx.protocols import get as protocol_spec
from phalanx.services.block_cert_api import (
    CertificateAnswer,
    CertificateQuery,
    MissingNodeKey,
    certificate_quorum,
    node_public_keys,
)

T = TypeVar("T")
SERVICE = "block-certifier"
"""The node service that collects and serves block certificates."""


def cluster_quorum(cluster: ClusterConfig) -> int:
    """Signatures a block certificate of this cluster needs (the protocol's fault model)."""
    return certificate_quorum(protocol_spec(cluster.protocol).fault_model, len(cluster.nodes))


def cluster_keys(cluster: ClusterConfig) -> dict[str, bytes] | None:
    """Every node's raw Ed25519 public key from cluster.toml, or None when one is missing
    (a cluster made before block certificates: certificates cannot be checked)."""
    try:
        return node_public_keys(cluster.nodes)
    except MissingNodeKey:
        return None


def certificate_check(header: BlockHeader, genesis: Genesis, cluster: ClusterConfig
                      ) -> bool | None:
    """THE CERTIFICATE VERDICT: whether `header.consensus_proof` is a block certificate of
    this header by a quorum of the cluster's node keys; None when the header carries none
    (or the cluster config has no node keys to check one against)."""
    keys = cluster_keys(cluster)
    if not header.consensus_proof or keys is None:
        return None
    return verify_header(header, keys, cluster_quorum(cluster), chain_id=chain_id(genesis))


@dataclass(frozen=True, slots=True, kw_only=True)
class CertificateView:
    """A block certificate as `phalanx chain block` shows it."""

    signers: tuple[str, ...]
    quorum: int
    nodes: int
    valid: bool | None
    """None: the cluster config has no node keys to check it against."""


def describe_certificate(header: BlockHeader, genesis: Genesis, cluster: ClusterConfig
                         ) -> CertificateView | None:
    cert = certificate_of(header)
    if cert is None:
        return None
    return CertificateView(signers=tuple(str(n) for n, _ in cert.signatures),
                           quorum=cluster_quorum(cluster), nodes=len(cluster.nodes),
                           valid=certificate_check(header, genesis, cluster))


async def find_certificate(cluster: ClusterConfig, genesis: Genesis, header: BlockHeader, *,
                           seconds: float = 1.0) -> tuple[CertificateView | None, str]:
    """The first certificate of `header`'s height a node serves (nodes in config order),
    attached to `header` and judged, with the node that served it; else (None, why)."""
    from phalanx.client.service_calls import call_service

    why = "no node has one yet"
    for node in cluster.nodes:
        try:
            answer = await call_service(cluster, node.id, SERVICE,
                                        CertificateQuery(height=header.height), seconds=seconds)
        except ClientError as e:
            why = f"no node serves certificates ({e})"
            continue
        cert = answer.certificate if isinstance(answer, CertificateAnswer) else None
        if isinstance(cert, BlockCertificate):
            proof = encode_certificate(cert)
            view = describe_certificate(dataclasses.replace(header, consensus_proof=proof),
                                        genesis, cluster)
            return view, node.id
    return None, why


@asynccontextmanager
async def one_node(cluster: ClusterConfig, node: str, *, call_timeout: float = 2.0
                   ) -> AsyncIterator[ChainClient]:
    """A chain client whose calls go to replica `node` only (stale reads: its own state)."""
    addr = next((n.client_addr for n in cluster.nodes if n.id == node), None)
    if addr is None:
        known = ", ".join(n.id for n in cluster.nodes)
        raise ValueError(f"no node {node!r} in the cluster (its nodes: {known})")
    context = pki.client_context(cluster.ca, certificate=cluster.client_cert,
                                 private_key=cluster.client_key, check_hostname=False)
    async with open_client([(node, addr.host, addr.port)], ssl_context=context,
                           protocol=cluster.protocol, timeout=call_timeout,
                           attempt_timeout=min(1.0, call_timeout),
                           client_id=pki.new_client_id(cluster.client_cert)) as client:
        yield ChainClient(client)


async def on_node(cluster: ClusterConfig, node: str,
                  call: Callable[[ChainClient], Awaitable[T]], *, call_timeout: float = 2.0) -> T:
    """`call` on a chain client of replica `node` alone; a `ClientError` it raises comes out
    as itself (not wrapped in the client's nursery's ExceptionGroup)."""
    failure: ClientError | None = None
    async with one_node(cluster, node, call_timeout=call_timeout) as chain:
        try:
            return await call(chain)
        except ClientError as e:
            failure = e
    raise failure


def faults(cluster: ClusterConfig) -> int:
    return protocol_spec(cluster.protocol).max_faults(len(cluster.nodes))


async def _ask_header(cluster: ClusterConfig, node: str, height: int,
                      seen: dict[str, BlockHeader]) -> None:
    try:
        block = await on_node(cluster, node, lambda c: c.block(height, stale=True),
                              call_timeout=1.0)
    except ClientError:
        return
    seen[node] = block[0]


async def agreed_header(cluster: ClusterConfig, height: int, *, within: float = 5.0
                        ) -> BlockHeader | None:
    """The header at `height` that f+1 replicas report byte-identically (each asked
    alone), or None when no header reaches f+1 within `within` seconds (replicas behind,
    or lying)."""
    need = faults(cluster) + 1
    deadline = trio.current_time() + within
    while True:
        seen: dict[str, BlockHeader] = {}
        async with trio.open_nursery() as nursery:
            for n in cluster.nodes:
                nursery.start_soon(_ask_header, cluster, n.id, height, seen)
        votes = Counter(encode_header(h) for h in seen.values())
        best = votes.most_common(1)
        if best and best[0][1] >= need:
            return next(h for h in seen.values() if encode_header(h) == best[0][0])
        if trio.current_time() >= deadline:
            return None
        await trio.sleep(0.2)


@dataclass(frozen=True, slots=True, kw_only=True)
class Verified:
    """A light-client verdict: `ok` when the replica's proof binds the account to
    (`balance`, `nonce`) under `header`, a header trusted by `trusted_by`."""

    ok: bool
    account: bytes
    replica: str
    balance: int = 0
    nonce: int = 0
    header: BlockHeader | None = None
    trusted_by: str = ""
    reason: str = ""


async def certified_header(cluster: ClusterConfig, node: str, height: int, *,
                           call_timeout: float = 2.0) -> tuple[BlockHeader, str, bool]:
    """Replica `node`'s header at `height` with the certificate its block-certifier stored
    attached as `consensus_proof` (unchecked: `certificate_check` judges it), why there is
    none ("" when attached), and whether one may still come (the signatures in flight).
    Raises `ClientError` when `node` gives no header."""
    from phalanx.client.service_calls import call_service

    header, _ = await on_node(cluster, node, lambda c: c.block(height, stale=True),
                              call_timeout=call_timeout)
    try:
        answer = await call_service(cluster, node, SERVICE, CertificateQuery(height=height),
                                    seconds=call_timeout)
    except ClientError as e:
        return header, f"{node} serves no certificates ({e})", False
    cert = answer.certificate if isinstance(answer, CertificateAnswer) else None
    if not isinstance(cert, BlockCertificate):
        return header, f"{node} has no certificate for block {height} yet", True
    try:
        proof = encode_certificate(cert)
    except Exception:  # a hostile answer whose fields do not encode
        return header, f"{node} answered an unencodable certificate", False
    return dataclasses.replace(header, consensus_proof=proof), "", False


async def verify_from_replica(cluster: ClusterConfig, genesis: Genesis, account: bytes,
                              replica: str, *, within: float = 5.0) -> Verified:
    """Ask `replica` alone for the account's proof and the header of its height with its
    block certificate; trust the header by the certificate (a bad one refuses it), or,
    when the replica has none within about a second, by f+1 identical reports (saying
    so); verify the proof against it."""
    def fail(reason: str, header: BlockHeader | None = None, by: str = "") -> Verified:
        return Verified(ok=False, account=account, replica=replica, header=header,
                        trusted_by=by, reason=reason)

    try:
        reply: AccountProof = await on_node(
            cluster, replica, lambda c: c.proof(account, stale=True), call_timeout=within)
    except ClientError as e:
        return fail(f"{replica} gave no proof: {e}")
    if reply.height == 0:
        return fail("no block yet: nothing to verify against")
    wait_until = trio.current_time() + min(1.0, within / 2)
    while True:
        try:
            header, missing, later = await certified_header(
                cluster, replica, reply.height, call_timeout=min(2.0, within))
        except ClientError as e:
            return fail(f"{replica} gave no header for block {reply.height}: {e}")
        if not later or trio.current_time() >= wait_until:
            break
        await trio.sleep(0.1)
    verdict = certificate_check(header, genesis, cluster)
    if verdict is None and not missing:
        missing = "cluster.toml has no node signing_public_key to check certificates"
    quorum = cluster_quorum(cluster)
    if verdict is False:
        return fail(f"block {header.height}'s certificate from {replica} does not verify "
                    f"(needs {quorum} valid signatures of the cluster's node keys)", header,
                    "certificate")
    if verdict:
        cert = certificate_of(header)
        signers = [str(n) for n, _ in cert.signatures] if cert is not None else []
        trusted_by = (f"certificate ({len(signers)} of {len(cluster.nodes)} node signatures: "
                      f"{','.join(signers)}; quorum {quorum}; valid)")
    else:
        agreed = await agreed_header(cluster, reply.height, within=within)
        if agreed is None:
            return fail(f"no certificate ({missing}) and no header at height "
                        f"{reply.height} reported by {faults(cluster) + 1} replicas alike")
        header = agreed
        trusted_by = f"{faults(cluster) + 1} matching replicas (no certificate: {missing})"
    trusted = encode_header(header)
    state = verify_account(header=header, account=account, value=reply.value,
                           proof=reply.proof,
                           trust_header=lambda h: encode_header(h) == trusted)
    if state is None or reply.state_root != header.state_root:
        return fail(f"{replica}'s proof does not verify against block {header.height}",
                    header, trusted_by)
    return Verified(ok=True, account=account, replica=replica, balance=state[0],
                    nonce=state[1], header=header, trusted_by=trusted_by)
