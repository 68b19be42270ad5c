"""The built-in apps' registry entries: the KV store and the blockchain.

Owns: `KV`, `CHAIN` and `SPECS`. Declarations only: the factories live in
`phalanx.appspec.kv_app` and `phalanx.appspec.chain_app`, the client helpers in
`phalanx.client.kv` / `phalanx.client.chain`, the workloads in `phalanx.jepsen.workloads`
and `phalanx.jepsen.chain_bank`, all loaded only when used.
"""

from __future__ import annotations

from phalanx.appspec.spec import AppSpec
from phalanx.protocols.spec import Lazy

KV = AppSpec(
    name="kv",
    summary="a key-value store: put/get/cas/scan/txn, commuting updates",
    machine=Lazy("phalanx.appspec.kv_app:build_machine"),
    client=Lazy("phalanx.client.kv:KvHelpers"),
    workloads=(
        ("register", Lazy("phalanx.appspec.kv_app:register_workload")),
        ("bank", Lazy("phalanx.appspec.kv_app:bank_workload")),
        ("set", Lazy("phalanx.appspec.kv_app:set_workload")),
    ),
)

CHAIN = AppSpec(
    name="chain",
    summary="a blockchain: signed transfers, blocks with Merkle state roots, light clients",
    machine=Lazy("phalanx.appspec.chain_app:build_machine"),
    files=("genesis",),
    init=Lazy("phalanx.appspec.chain_app:init_files"),
    client=Lazy("phalanx.client.chain:ChainClient"),
    workloads=(("bank", Lazy("phalanx.jepsen.chain_bank:bank_workload")),),
    demo=Lazy("phalanx.demo.chain:run"),
    services=("block-certifier",),
    total_order=True,
)

SPECS: tuple[AppSpec, ...] = (KV, CHAIN)
