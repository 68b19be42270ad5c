"""Nodes embedded in your own trio program, with your own state machine: public API only.

Three nodes of a Raft cluster run in this one process, replicating `TicketMachine`
(examples/tickets.py: strictly increasing ticket numbers per queue). The program takes
tickets through the public client, stops the leader, and takes more: the client finds the new
leader by itself, and numbers never repeat or skip (each take is applied exactly once, even
when the client had to retry it).

Run it:  python examples/counter_service.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import trio

import phalanx

TICKETS = Path(__file__).resolve().parent / "tickets.py"


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="phalanx-tickets-") as tmp:
        # A cluster directory: CA, certificates, one config per node, the app to run.
        cluster = phalanx.init_cluster(Path(tmp) / "tickets", nodes=3,
                                       app=f"{TICKETS}:TicketMachine",
                                       base_port=phalanx.find_free_base_port(3))
        async with trio.open_nursery() as nursery:
            nodes: dict[str, phalanx.Node] = {}
            scopes: dict[str, trio.CancelScope] = {}

            async def run(node_id: str, task_status: trio.TaskStatus[phalanx.Node]) -> None:
                config = phalanx.load_node_config(cluster.node_config_path(node_id))
                with trio.CancelScope() as scope:
                    scopes[node_id] = scope
                    async with phalanx.open_node(config) as node:
                        task_status.started(node)
                        await trio.sleep_forever()

            for peer in cluster.nodes:
                nodes[peer.id] = await nursery.start(run, peer.id)

            async def leader() -> phalanx.Node:
                with trio.fail_after(10):
                    while True:
                        found = [n for n in nodes.values() if n.core_status().role == "leader"]
                        if len(found) == 1:
                            return found[0]
                        await trio.sleep(0.01)

            async with phalanx.open_client(cluster, timeout=10) as client:

                async def take(queue: str) -> int:
                    return int(await client.call(f"take:{queue}".encode()))

                first = await leader()
                print(f"leader: {first.id}")
                tickets = [await take("bakery") for _ in range(3)]
                print(f"took tickets {tickets} at the bakery")
                scopes[first.id].cancel()  # the leader stops; the client carries on
                del nodes[first.id]
                more = [await take("bakery") for _ in range(2)]
                second = await leader()
                print(f"{first.id} stopped; new leader {second.id}; took tickets {more}")
                peek = int(await client.call(b"peek:bakery", read_only=True))
                print(f"a linearizable query says the bakery is at ticket {peek}")
            if tickets != [1, 2, 3] or more != [4, 5] or peek != 5:
                raise SystemExit("FAILED: tickets repeated or skipped")
            print("ok: tickets never repeat across a leader change")
            nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(main)
