"""PBFT's checkpoint digest for the chain app, before and after the app's own digest hook.

Before: PBFT's checkpoint vote carried SHA-256 of the whole serialised replica checkpoint
(`crypto.digest(data)`), computed on the core's task for every checkpoint (every K = 64
sequence numbers on a cluster). After (`phalanx.apps.checkpoint_digest`): the chain's
`state_digest` (header fields, state root, dirty accounts, running block hash) on the apply
task plus SHA-256 of the envelope prefix (sessions) while the writer serialises it; the
full check of fetched bytes (`digest_function`: parse and rebuild the tree, which the
install then reuses) runs only on state transfer and restart. Builds a chain of
`--accounts` accounts (genesis allocation) with `--blocks` blocks of `--txs` signed
transfers, then measures CPU time (median of `--rounds`):

    .venv/bin/python bench/chain_checkpoint_digest.py [--accounts 1000000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import hashlib
import random
import statistics
import time
from collections.abc import Callable

import immutables
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from phalanx.apps.chain.block import chain_id
from phalanx.apps.chain.machine import ChainStateMachine
from phalanx.apps.chain.tx import TxBody, public_key, sign
from phalanx.apps.chain.types import Genesis
from phalanx.apps.checkpoint_digest import CheckpointDigests, digest_function
from phalanx.apps.envelope import Session, envelope_chunks
from phalanx.apps.interface import BatchInfo

_now = time.process_time


def _median_ms(fn: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = _now()
        fn()
        times.append(_now() - start)
    return 1000 * statistics.median(times)


def build(accounts: int, blocks: int, txs: int, rng: random.Random) -> ChainStateMachine:
    keys = [Ed25519PrivateKey.from_private_bytes(rng.randbytes(32)) for _ in range(txs)]
    senders = [public_key(k) for k in keys]
    others = {rng.randbytes(32) for _ in range(max(accounts - txs, 0))}
    balances = tuple(sorted((a, 1_000) for a in set(senders) | others))
    genesis = Genesis(minter=senders[0], balances=balances, name="bench")
    m = ChainStateMachine(genesis, trust_leader_admission=True)
    cid = chain_id(genesis)
    targets = sorted(others)[:1000] or senders
    for b in range(blocks):
        m.begin_batch(BatchInfo(index=b + 1, timestamp=1_700_000_000_000 + b, proposer="n1"))
        for i, key in enumerate(keys):
            body = TxBody(chain_id=cid, sender=senders[i], nonce=b + 1, method="transfer",
                          args=(rng.choice(targets), 1))
            m.apply(sign(key, body).raw)
        m.end_batch()
    return m


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--accounts", type=int, default=1_000_000)
    p.add_argument("--blocks", type=int, default=20)
    p.add_argument("--txs", type=int, default=100, help="transfers per block")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    rng = random.Random(7)
    start = time.perf_counter()
    m = build(args.accounts, args.blocks, args.txs, rng)
    print(f"built {args.accounts} accounts, {args.blocks} blocks of {args.txs} transfers "
          f"in {time.perf_counter() - start:.1f} s")
    sessions: immutables.Map[str, Session] = immutables.Map()

    def serialise() -> bytes:
        return b"".join(envelope_chunks(index=args.blocks, sessions=sessions,
                                        app=m.snapshot()))

    data = serialise()
    digests = CheckpointDigests(m)

    def serialise_digesting() -> bytes:
        out = b"".join(digests.chunks(args.blocks, lambda app: envelope_chunks(
            index=args.blocks, sessions=sessions, app=app), m.snapshot()))
        digests.taken(args.blocks)
        return out

    rows = [
        ("checkpoint size", f"{len(data) / 1e6:.1f} MB"),
        ("serialise the checkpoint (the writer's work, for scale)",
         f"{_median_ms(serialise, args.rounds):.0f} ms"),
        ("BEFORE: vote digest = SHA-256 of the checkpoint bytes",
         f"{_median_ms(lambda: hashlib.sha256(data).digest(), args.rounds):.1f} ms"),
        ("AFTER: vote digest = state_digest() (apply task)",
         f"{_median_ms(m.state_digest, args.rounds) * 1000:.0f} us"),
        ("AFTER: serialise while hashing the envelope prefix (writer)",
         f"{_median_ms(serialise_digesting, args.rounds):.0f} ms"),
    ]
    app_data = data[len(data) - len(b"".join(m.snapshot().chunks())):]
    fresh = ChainStateMachine(m.genesis, trust_leader_admission=True)
    verify_fresh = digest_function(fresh)  # the node's own machine verifies, then installs
    assert verify_fresh is not None

    def transfer_before() -> None:  # verify by SHA-256 of the bytes, then install
        fresh._loaded = None  # each round starts cold (the machine's one-entry load cache)
        hashlib.sha256(data).digest()
        fresh.restore(app_data)

    def transfer_after() -> None:  # verify by the app digest (loads once), then install
        fresh._loaded = None
        verify_fresh(data)
        fresh.restore(app_data)

    few = max(1, args.rounds // 2)
    rows += [
        ("state transfer, verify + install: BEFORE", f"{_median_ms(transfer_before, few):.0f} ms"),
        ("state transfer, verify + install: AFTER", f"{_median_ms(transfer_after, few):.0f} ms"),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


if __name__ == "__main__":
    main()
