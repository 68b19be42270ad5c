"""Protocols as plug-ins: the registry (`get`, `names`, `register`) and the spec type.

A protocol is one package (its core, its wire types) plus one `ProtocolSpec` registered
here; the runtime, client, CLI, simulator, harness and benches look everything
protocol-specific up in the spec. Built-in: `raft`, `pbft` (`phalanx.protocols.builtin`);
plug-ins through ``PHALANX_PROTOCOLS`` or the ``phalanx.protocols`` entry-point group
(`phalanx.protocols.registry`). See docs/ARCHITECTURE.md, "Adding a protocol".
"""

from phalanx.protocols.registry import (
    DEFAULT_PROTOCOL,
    UnknownProtocol,
    byzantine_mode_problem,
    get,
    names,
    register,
    specs,
)
from phalanx.protocols.spec import (
    BuiltCore,
    ByzantineSupport,
    CallStrategy,
    FaultModel,
    Lazy,
    ProposerRule,
    ProtocolError,
    ProtocolNode,
    ProtocolSpec,
)

__all__ = [
    "DEFAULT_PROTOCOL",
    "BuiltCore",
    "ByzantineSupport",
    "CallStrategy",
    "FaultModel",
    "Lazy",
    "ProposerRule",
    "ProtocolError",
    "ProtocolNode",
    "ProtocolSpec",
    "UnknownProtocol",
    "byzantine_mode_problem",
    "get",
    "names",
    "register",
    "specs",
]
