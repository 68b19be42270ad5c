"""The node-services host: runs a node's enabled services beside its consensus core.

Owns: `ServiceHost`, built by `phalanx.runtime.node.open_node` from the config's service
tables through the registry (`phalanx.services`), never by name. For each enabled service it:
- registers the service's peer wire types with the codec and routes inbound peer messages
  of those types to it (`route` wraps the driver's `deliver`: every other message goes to
  the core unchanged). The service's messages travel on the node's existing mTLS peer links;
  there is no second transport. Messages of a registered service that is disabled here are
  dropped and counted (`disabled_service_messages`), so a cluster may mix nodes with and
  without a service without a decode error closing a link.
- ticks it every `NodeService.tick_seconds` (`phalanx.runtime.ticker.Ticker`; a late wake-up
  gives one tick, not a burst);
- flushes the transport after each step that sent something, so a step's sends leave in
  one write per peer (a step that sent nothing flushes nothing: flushing would push out
  the core's queued messages early, in smaller writes);
- answers `ServiceCall`s from the client port (`service_call`), checking the caller's role
  against `NodeService.needed_role` first;
- exports the service's counters and gauges on the node's metrics page
  (``phalanx_service_events_total{service,event}``, ``phalanx_service_state{service,name}``).

Invariants: every service method runs synchronously in the node's trio tasks, one at a time
(trio is single-threaded), so services need no locks; a service never blocks the core
except for the CPU its steps take. Must not import: consensus cores, any service's modules
(they load through the registry).
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Protocol

import trio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from phalanx.consensus.types import Message, NodeId
from phalanx.net import wire
from phalanx.net.client_protocol import ReplyStatus
from phalanx.ops.node_config import NodeConfig
from phalanx.runtime.client_auth import Principal
from phalanx.runtime.ticker import Ticker
from phalanx.services import NodeService, ServiceContext, ServiceError
from phalanx.services import get as get_service
from phalanx.services import specs as service_specs
from phalanx.services.config import enabled_services
from phalanx.services.messages import ServiceCall, ServiceReply
from phalanx.services.messages import register as register_service_calls

logger = logging.getLogger(__name__)

SNAPSHOT_SECONDS = 1.0
"""How often the metrics page's copy of a service's counters is refreshed."""

Deliver = Callable[[NodeId, object], Awaitable[None]]


class _Sender(Protocol):
    def send_nowait(self, dst: NodeId, message: object) -> bool: ...

    def flush(self) -> None: ...


class ServiceHost:
    """A node's services (see the module docstring). `services` maps name -> service."""

    def __init__(self, config: NodeConfig, *, transport: _Sender, rng: random.Random,
                 wall_clock: Callable[[], float] = time.time,
                 machine: object | None = None,
                 submit: Callable[[bytes], bool] | None = None,
                 checkpoint: Callable[[], tuple[int, bytes] | None] | None = None) -> None:
        self._node = config.id
        self._transport = transport
        self.services: dict[str, NodeService] = {}
        self._routes: dict[type, NodeService | None] = {}
        self.disabled_messages = 0
        self._sent = False
        self.snapshots: dict[str, tuple[dict[str, int], dict[str, int]]] = {}
        """Each service's (counters, gauges), refreshed every `SNAPSHOT_SECONDS`."""
        register_service_calls()
        enabled = enabled_services(config.services)
        for spec in service_specs():  # every registered service's types decode
            messages = spec.messages.load()
            wire.register_all(messages)
            for cls in messages.values():
                self._routes.setdefault(cls, None)
        for name in enabled:
            spec = get_service(name)
            if spec.client_messages is not None:
                wire.register_all(spec.client_messages.load())
            state_dir = config.data_dir / "services"
            state_dir.mkdir(parents=True, exist_ok=True)
            service = spec.build.load()(ServiceContext(
                config=config, options=config.services[name], send=self._send,
                wall_clock=wall_clock, rng=random.Random(rng.getrandbits(64)),
                state_dir=state_dir, machine=machine, submit=submit,
                checkpoint=checkpoint, services=self.services))
            self.services[name] = service
            self.snapshot(name)
            for cls in spec.messages.load().values():
                if self._routes.get(cls) is not None:
                    raise ServiceError(f"{cls.__name__} is claimed by two services")
                self._routes[cls] = service

    def _send(self, dst: NodeId, message: Message) -> bool:
        self._sent = True
        return self._transport.send_nowait(dst, message)

    def _flush_if_sent(self) -> None:
        if self._sent:
            self._sent = False
            self._transport.flush()

    def route(self, deliver: Deliver) -> Deliver:
        """The transport's `deliver`: services' messages to them, the rest to `deliver`."""
        routes, flush = self._routes, self._flush_if_sent

        async def route(src: NodeId, message: object) -> None:
            cls = type(message)
            if cls not in routes:
                await deliver(src, message)
                return
            service = routes[cls]
            if service is None:
                self.disabled_messages += 1
                return
            service.receive(src, message)  # type: ignore[arg-type]  # registered Messages
            flush()

        return route

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Tick every service until cancelled; closes them when cancelled."""
        try:
            async with trio.open_nursery() as nursery:
                for name, service in self.services.items():
                    nursery.start_soon(self._ticks, name, service)
                task_status.started()
        finally:
            for service in self.services.values():
                service.close()

    async def _ticks(self, name: str, service: NodeService) -> None:
        flush = self._flush_if_sent
        every = max(1, round(SNAPSHOT_SECONDS / service.tick_seconds))
        with Ticker(service.tick_seconds) as ticker:
            ticks = 0
            while True:
                await ticker.wait()  # periods missed while late: one tick, not a burst
                service.tick()
                flush()
                ticks += 1
                if ticks % every == 0:
                    self.snapshot(name)

    def snapshot(self, name: str) -> None:
        """Copy service `name`'s counters for the metrics page (read on another thread)."""
        service = self.services[name]
        self.snapshots[name] = (dict(service.counters()), dict(service.gauges()))

    def service_call(self, call: ServiceCall, principal: Principal | None) -> ServiceReply:
        """Answer a client's `ServiceCall` (never raises for client input)."""
        service = self.services.get(call.service)
        if service is None:
            on = ", ".join(sorted(self.services)) or "none"
            return ServiceReply(nonce=call.nonce, status=ReplyStatus.ERROR,
                                message=f"node {self._node} runs no {call.service!r} service "
                                        f"(running: {on}); enable it in the node config")
        needed = service.needed_role(call.request)
        if principal is not None and not principal.may(needed):
            return ServiceReply(nonce=call.nonce, status=ReplyStatus.FORBIDDEN,
                                message=f"this call needs role {needed}; client "
                                        f"{principal.name!r} has role {principal.role}")
        try:
            result = service.call(call.request)
        except ValueError as e:
            return ServiceReply(nonce=call.nonce, status=ReplyStatus.ERROR, message=str(e))
        self._transport.flush()
        return ServiceReply(nonce=call.nonce, status=ReplyStatus.OK, result=result)

    def collector(self) -> Collector:
        """The services' counters and gauges for the node's metrics registry."""
        return _ServiceCollector(self._node, self.snapshots, lambda: self.disabled_messages)


_LABEL = re.compile(r"[^A-Za-z0-9_:]")


class _ServiceCollector(Collector):
    """Reads the services' snapshots at scrape time (on the HTTP server's thread; the
    snapshots are replaced whole by the node's task, never mutated)."""

    def __init__(self, node: str,
                 snapshots: Mapping[str, tuple[dict[str, int], dict[str, int]]],
                 disabled: Callable[[], int]) -> None:
        self._node = node
        self._snapshots = snapshots
        self._disabled = disabled

    def collect(self) -> Iterator[Metric]:
        events = CounterMetricFamily(
            "phalanx_service_events", "Events counted by each node service (gossip, "
            "block-certifier, ...), by event: messages sent and received, messages dropped "
            "by reason; service \"\" counts messages for services this node does not run",
            labels=["node", "service", "event"])
        state = GaugeMetricFamily(
            "phalanx_service_state", "Current sizes and states of each node service, by name "
            "(queue lengths, members and rumors known, ...)", labels=["node", "service", "name"])
        for name, (counters, gauges) in sorted(dict(self._snapshots).items()):
            for event, value in sorted(counters.items()):
                events.add_metric([self._node, name, _LABEL.sub("_", event)], value)
            for gauge, value in sorted(gauges.items()):
                state.add_metric([self._node, name, gauge], value)
        events.add_metric([self._node, "", "disabled_service_messages"], self._disabled())
        yield events
        yield state
