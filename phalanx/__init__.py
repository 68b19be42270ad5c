"""phalanx: crash- and Byzantine-fault-tolerant replicated state machines.

Subpackages: `phalanx.consensus` (sans-IO cores), `phalanx.storage` (WAL, checkpoints),
`phalanx.apps` (StateMachine API, replica layer, KV), `phalanx.net` (codec),
`phalanx.jepsen` (histories, checkers, simulator).
"""

__version__ = "0.1.0"
