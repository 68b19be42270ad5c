"""Chain app costs: the state root per block, proofs, and signatures on or off the apply path.

Measures CPU time (`_now`), on one core, with the collector paced as the node runtime does
(`GcPacer.settle` after the build: the tree's nodes are long-lived):
1. building a sparse Merkle tree of `--accounts` accounts (1M by default);
2. the Merkle update per block of 100 and 1,000 transfers (2 dirty accounts each): one
   `update_batch` per block, against one update per transfer (what batching saves);
3. proof size (inclusion and non-inclusion) and `verify_proof` time; block certificate
   size, collection and verification time (n = 4 and 7);
4. per transaction: `verify_stateless` (decode + chain id + Ed25519) and
   `ChainStateMachine.apply` under each signature policy: verified in apply (a transaction
   this node did not admit, or `admitted_cache_size=0`), admitted by this node's own `admit`
   (the default policy's saving), and `trust_leader_admission` (crash faults only).

    .venv/bin/python bench/chain_merkle.py [--accounts 1000000] [--rounds 5] [--txs 2000]
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import time
from collections.abc import Callable, Iterator

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from phalanx.apps.chain.block import BlockHeader, block_hash, chain_id
from phalanx.apps.chain.certificate import (
    BlockCertifier,
    byzantine_certificate_quorum,
    encode_certificate,
    sign_block,
    verify_certificate,
)
from phalanx.apps.chain.machine import ChainStateMachine
from phalanx.apps.chain.smt import SparseMerkleTree, verify_proof
from phalanx.apps.chain.state import encode_account
from phalanx.apps.chain.tx import TxBody, decode_tx, public_key, sign, verify_stateless
from phalanx.apps.chain.types import Genesis
from phalanx.apps.gc_pacer import GcPacer
from phalanx.apps.interface import BatchInfo

_now = time.process_time
"""CPU time of this process: on the shared, loaded dev machine it leaves out the time spent
waiting for a core (on an idle machine it equals wall time for this single-threaded work)."""


def _median_s(fn: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = _now()
        fn()
        times.append(_now() - start)
    return statistics.median(times)


def merkle(accounts: int, rounds: int, rng: random.Random) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    keys = [rng.randbytes(32) for _ in range(accounts)]
    values = [encode_account(rng.randrange(1, 10**9), 0) for _ in range(accounts)]
    start = _now()
    tree = SparseMerkleTree.from_items(zip(keys, values, strict=True))
    rows.append((f"build SMT of {accounts:,} accounts", f"{_now() - start:.1f} s"))
    GcPacer().settle()

    for block in (100, 1000):
        def changes(block: int = block) -> list[tuple[bytes, bytes]]:
            picked = rng.sample(range(accounts), 2 * block)  # 2 distinct accounts per transfer
            return [(keys[i], encode_account(rng.randrange(10**9), 1)) for i in picked]

        batches = [changes() for _ in range(rounds)]
        it = iter(batches)
        batched = _median_s(lambda it=it: tree.update_batch(next(it)), rounds)
        rows.append((f"Merkle update, block of {block:,} transfers (one batch)",
                     f"{batched * 1e3:.1f} ms ({batched / block * 1e6:.0f} us/tx)"))
        if block == 100:
            it2 = iter(batches)

            def per_tx(it2: Iterator[list[tuple[bytes, bytes]]] = it2) -> None:
                t = tree
                batch = next(it2)
                for i in range(0, len(batch), 2):
                    t = t.update_batch(batch[i:i + 2])

            unbatched = _median_s(per_tx, rounds)
            rows.append((f"  same, tree updated per transfer ({block} batches of 2)",
                         f"{unbatched * 1e3:.1f} ms ({unbatched / block * 1e6:.0f} us/tx)"))

    present = rng.sample(keys, 1000)
    absent = [rng.randbytes(32) for _ in range(1000)]
    value_of = dict(zip(keys, values, strict=True))
    for label, probe in (("inclusion", present), ("non-inclusion", absent)):
        start = _now()
        proofs = [tree.prove(k) for k in probe]
        prove_us = (_now() - start) / len(probe) * 1e6
        start = _now()
        ok = all(verify_proof(tree.root, k, value_of.get(k), p)
                 for k, p in zip(probe, proofs, strict=True))
        verify_us = (_now() - start) / len(probe) * 1e6
        assert ok
        sizes = [len(p) for p in proofs]
        rows.append((f"{label} proof: size mean/max",
                     f"{statistics.mean(sizes):.0f} / {max(sizes)} bytes"))
        rows.append((f"{label} proof: prove / verify", f"{prove_us:.0f} / {verify_us:.0f} us"))
    return rows


def signatures(txs: int, rounds: int, rng: random.Random) -> list[tuple[str, str]]:
    senders = [Ed25519PrivateKey.from_private_bytes(rng.randbytes(32)) for _ in range(64)]
    accounts = [public_key(k) for k in senders]
    genesis = Genesis(minter=accounts[0],
                      balances=tuple(sorted((a, 10**12) for a in accounts)))
    chain = chain_id(genesis)
    nonces = dict.fromkeys(range(len(senders)), 0)
    raws = []
    for _ in range(txs):
        s = rng.randrange(len(senders))
        nonces[s] += 1
        body = TxBody(chain_id=chain, sender=accounts[s], nonce=nonces[s], method="transfer",
                      args=(accounts[rng.randrange(len(accounts))], rng.randrange(1, 1000)))
        raws.append(sign(senders[s], body).raw)

    def per_tx(fn: Callable[[bytes], object]) -> float:
        best = float("inf")
        for _ in range(rounds):
            start = _now()
            for raw in raws:
                fn(raw)
            best = min(best, _now() - start)
        return best / len(raws) * 1e6

    def apply_all(policy: str) -> float:
        m = ChainStateMachine(genesis, trust_leader_admission=policy == "trust",
                              admitted_cache_size=0 if policy == "verify" else len(raws))
        if policy == "admitted":
            for raw in raws:  # on arrival, before ordering: not timed here
                assert m.admit(raw, read_only=False) is None
        start = _now()
        for i in range(0, len(raws), 1000):  # blocks of 1,000, tree update included
            m.begin_batch(BatchInfo(index=i, timestamp=i, proposer="bench"))
            for raw in raws[i:i + 1000]:
                m.apply(raw)
            m.end_batch()
        return (_now() - start) / len(raws) * 1e6

    decode_us = per_tx(decode_tx)
    stateless_us = per_tx(lambda raw: verify_stateless(raw, chain_id=chain))
    admitter = ChainStateMachine(genesis)
    admit_us = per_tx(lambda raw: admitter.admit(raw, read_only=False))
    best: dict[str, float] = {}
    for _ in range(rounds):  # interleaved, the fastest of each: the machine's load drifts
        for policy in ("verify", "admitted", "trust"):
            best[policy] = min(best.get(policy, float("inf")), apply_all(policy))
    verified, admitted, trusted = best["verify"], best["admitted"], best["trust"]
    return [
        (f"decode_tx (format only), {txs:,} txs", f"{decode_us:.1f} us/tx"),
        ("verify_stateless (format + chain id + Ed25519)", f"{stateless_us:.1f} us/tx"),
        ("admit (verify_stateless + admitted cache)", f"{admit_us:.1f} us/tx"),
        ("apply + end_batch, signature verified in apply", f"{verified:.1f} us/tx"),
        ("apply + end_batch, admitted by this node (default policy)",
         f"{admitted:.1f} us/tx (saves {verified - admitted:.1f}, "
         f"{(1 - admitted / verified) * 100:.0f}%)"),
        ("apply + end_batch, trust_leader_admission (crash faults only)",
         f"{trusted:.1f} us/tx (saves {verified - trusted:.1f}, "
         f"{(1 - trusted / verified) * 100:.0f}%)"),
    ]


def certificates(rounds: int) -> list[tuple[str, str]]:
    """Certificate size and costs for n = 4 (quorum 3) and n = 7 (quorum 5)."""
    rows: list[tuple[str, str]] = []
    header = BlockHeader(height=7, prev_hash=bytes(32), tx_root=bytes(32), state_root=bytes(32),
                         timestamp=0, proposer="n0")
    chain = bytes(range(32))
    for n in (4, 7):
        quorum = byzantine_certificate_quorum(n)
        secrets = {f"n{i}": Ed25519PrivateKey.from_private_bytes(bytes([i + 1]) * 32)
                   for i in range(n)}
        keys = {node: public_key(k) for node, k in secrets.items()}
        certifier = BlockCertifier(node="n0", sign=secrets["n0"].sign, chain_id=chain,
                                   node_keys=keys, quorum=quorum)
        sigs = [sign_block(node=node, chain_id=chain, height=7, block_hash=block_hash(header),
                           sign=k.sign) for node, k in secrets.items()]
        start = _now()
        cert = None
        for sig in sigs:
            cert = cert or certifier.add(sig)
        collect_us = (_now() - start) * 1e6
        assert cert is not None
        verify_s = _median_s(lambda cert=cert, keys=keys, quorum=quorum: verify_certificate(
            cert, header, keys, quorum, chain_id=chain), rounds * 20)
        rows.append((f"block certificate n={n} (quorum {quorum}): size / collect / verify",
                     f"{len(encode_certificate(cert))} bytes / {collect_us:.0f} us / "
                     f"{verify_s * 1e6:.0f} us"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--accounts", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--txs", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    rows = (signatures(args.txs, args.rounds, rng) + certificates(args.rounds)
            + merkle(args.accounts, args.rounds, rng))
    rows.append(("peak RSS", f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MB"))
    width = max(len(label) for label, _ in rows)
    print(f"{'measure':<{width}}  value")
    for label, value in rows:
        print(f"{label:<{width}}  {value}")


if __name__ == "__main__":
    main()
