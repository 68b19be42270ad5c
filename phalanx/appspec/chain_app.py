"""The chain app's files and factory for the app registry (`phalanx.appspec.builtin.CHAIN`).

Owns: the chain files of a cluster directory and their format:

    DIR/chain/genesis.bin        the `Genesis` (codec bytes: `phalanx.apps.chain.types`)
    DIR/chain/keys/<name>.key    an account's Ed25519 seed, hex, one line (mode 0600):
                                 ``minter`` (may mint) and ``a1``..``aN`` (funded at genesis)

`init_files` (`cluster init --app chain`) writes them; `build_machine` reads the genesis a
node config's ``[app] genesis`` names; `read_genesis`, `account_key`, `key_names` serve the
client, the CLI and the harness.

Errors: a missing or malformed file raises `AppConfigError` naming it (never an assert).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Final

from phalanx.appspec.spec import AppConfigError, AppFiles

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from phalanx.apps.chain.machine import ChainStateMachine
    from phalanx.apps.chain.types import Genesis

CHAIN_DIR: Final = "chain"
GENESIS_FILE: Final = "genesis.bin"
KEYS_DIR: Final = "keys"
MINTER: Final = "minter"
FUNDED_ACCOUNTS: Final = 5
OPENING_BALANCE: Final = 1_000_000
KEY_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")


def keys_dir(cluster_dir: Path) -> Path:
    return cluster_dir / CHAIN_DIR / KEYS_DIR


def key_path(cluster_dir: Path, name: str) -> Path:
    """DIR/chain/keys/NAME.key. Raises `AppConfigError` on a bad name."""
    if KEY_NAME.fullmatch(name) is None:
        raise AppConfigError(f"account name {name!r}: use 1-64 letters, digits, '_' or '-'")
    return keys_dir(cluster_dir) / f"{name}.key"


def new_key(path: Path) -> bytes:
    """Write a fresh account key to `path` (mode 0600, never overwriting); return its raw
    32-byte public key (the account). Raises `AppConfigError` when the file exists."""
    from phalanx.ops.signing_keys import generate_client_key

    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return generate_client_key(path)
    except FileExistsError:
        raise AppConfigError(f"{path} exists; refusing to overwrite a key") from None


def account_key(path: Path) -> Ed25519PrivateKey:
    """The private key in account key file `path`. Raises `AppConfigError`."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from phalanx.ops.signing_keys import SigningKeyError, read_seed

    try:
        return Ed25519PrivateKey.from_private_bytes(read_seed(path))
    except SigningKeyError as e:
        raise AppConfigError(str(e)) from None


def key_names(cluster_dir: Path) -> tuple[str, ...]:
    """The names of the account keys in DIR/chain/keys, sorted."""
    found = keys_dir(cluster_dir).glob("*.key")
    return tuple(sorted(p.stem for p in found if KEY_NAME.fullmatch(p.stem)))


def init_files(cluster_dir: Path) -> dict[str, Path]:
    """Write DIR/chain/: a minter key, `FUNDED_ACCOUNTS` account keys each holding
    `OPENING_BALANCE` at genesis, and the genesis. Returns the ``[app]`` table."""
    from phalanx.apps.chain.types import Genesis, encode

    minter = new_key(key_path(cluster_dir, MINTER))
    accounts = [new_key(key_path(cluster_dir, f"a{i}")) for i in range(1, FUNDED_ACCOUNTS + 1)]
    genesis = Genesis(minter=minter,
                      balances=tuple(sorted((a, OPENING_BALANCE) for a in accounts)))
    path = cluster_dir / CHAIN_DIR / GENESIS_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(encode(genesis))
    return {"genesis": path}


def read_genesis(path: Path) -> Genesis:
    """The genesis in `path`. Raises `AppConfigError` naming the file."""
    from phalanx.apps.chain.types import decode_genesis
    from phalanx.net.codec import DecodeError

    try:
        data = path.read_bytes()
    except OSError as e:
        raise AppConfigError(f"{path}: cannot read the chain genesis: {e.strerror}") from None
    try:
        return decode_genesis(data)
    except (DecodeError, ValueError) as e:
        raise AppConfigError(f"{path}: not a chain genesis: {e}") from None


def build_machine(files: AppFiles) -> ChainStateMachine:
    """The node's `ChainStateMachine` over ``[app] genesis`` (signatures verified in apply:
    the default until the verification policy is settled)."""
    from phalanx.apps.chain.machine import ChainStateMachine

    return ChainStateMachine(read_genesis(files["genesis"]))
