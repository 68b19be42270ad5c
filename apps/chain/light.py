"""Light-client verification: an account's state against a block header, from one possibly
Byzantine replica.

Owns: `verify_account`, `verify_balance` and `trust_by_certificate`. A light client holds no
state: it trusts a header only through `trust_header` (normally `trust_by_certificate`: the
header's consensus proof must be a `BlockCertificate` of a quorum of the cluster's node keys,
`phalanx.apps.chain.certificate`), then checks the replica's SMT proof against that header's
state root (`phalanx.apps.chain.smt.verify_proof`). What it then knows depends on the quorum
(see the certificate module): under Byzantine faults, that the balance is the one honest
replicas committed at that height.

Must not import: consensus cores, storage, trio, clocks.

Invariants: pure, never raises on any input (everything a replica sends is input); accepts
only when the header is trusted AND the proof binds `account` to the claimed value (or to
absence, which means balance 0 and nonce 0) under the header's state root.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from phalanx.apps.chain.block import BlockHeader
from phalanx.apps.chain.certificate import check_quorum, verify_header
from phalanx.apps.chain.smt import verify_proof
from phalanx.apps.chain.state import ACCOUNT_BYTES, decode_account
from phalanx.apps.chain.types import AccountProof

TrustFn = Callable[[BlockHeader], bool]


def trust_by_certificate(node_keys: Mapping[str, bytes], quorum: int, *, chain_id: bytes
                         ) -> TrustFn:
    """A `trust_header` callback: the header's `consensus_proof` must be a certificate of at
    least `quorum` of `node_keys` (node id -> raw Ed25519 public key) for this header on
    chain `chain_id` (`certificate.verify_certificate`). Raises ValueError now on a quorum
    outside 1..len(node_keys) (our misuse)."""
    keys = dict(node_keys)
    check_quorum(quorum, keys)

    def trust(header: BlockHeader) -> bool:
        return verify_header(header, keys, quorum, chain_id=chain_id)

    return trust


def verify_account(*, header: BlockHeader, account: bytes, value: bytes | None, proof: bytes,
                   trust_header: TrustFn) -> tuple[int, int] | None:
    """The account's verified (balance, nonce) at `header`, or None when anything fails:
    the header is not trusted, `value` is not an account value, or the proof does not bind
    it. `value` None claims the account is absent (verified as (0, 0))."""
    if not isinstance(header, BlockHeader) or type(account) is not bytes or len(account) != 32:
        return None
    if value is not None and (type(value) is not bytes or len(value) != ACCOUNT_BYTES):
        return None
    try:
        trusted = trust_header(header) is True
    except Exception:  # a callback failing on hostile input is a refusal, not a crash
        return None
    if not trusted or not verify_proof(header.state_root, account, value, proof):
        return None
    return decode_account(value)


def verify_balance(*, header: BlockHeader, account: bytes, balance: int, reply: AccountProof,
                   trust_header: TrustFn) -> bool:
    """Whether `account` held exactly `balance` at `header`, per `reply` (a replica's answer
    to `GetAccountProof`, which must be for this account and this header's state root)."""
    if not isinstance(reply, AccountProof) or reply.account != account:
        return False
    if reply.state_root != header.state_root:
        return False
    verified = verify_account(header=header, account=account, value=reply.value,
                              proof=reply.proof, trust_header=trust_header)
    return verified is not None and type(balance) is int and verified[0] == balance
