"""Node services as plug-ins: sans-IO auxiliary machines a node runs beside its core.

A service is one package (its machine and wire types; gossip's is `phalanx.gossip`) plus a
runtime driver and one `ServiceSpec` registered here. The runtime host
(`phalanx.runtime.services`) ticks each enabled service, routes the service's peer message
types to it over the node's existing peer links, exports its counters on the metrics page
and serves its client-port operations (`phalanx.services.messages`); the config loader
reads its ``[name]`` table. Nothing outside a service's own modules compares its name.
Built-in: ``gossip`` (`phalanx.services.builtin`). See docs/ARCHITECTURE.md, "Node services".
"""

from phalanx.services.registry import UnknownService, get, names, register, specs
from phalanx.services.spec import (
    NodeService,
    ServiceContext,
    ServiceError,
    ServiceOption,
    ServiceSpec,
)

__all__ = ["NodeService", "ServiceContext", "ServiceError", "ServiceOption", "ServiceSpec",
           "UnknownService", "get", "names", "register", "specs"]
