"""The simulator's resume steps a fresh clock reading first (`SimNode.fresh_clock`, from
`ProtocolSpec.deadline_clock`): a leaderless node paused past a transaction's deadline, which
a peer relayed during the pause, does not endorse it on resume. Raft's and PBFT's nodes do
not get the flag (their traces stay as they were: `bench/trace_hashes.py --check`).
"""

from __future__ import annotations

import dataclasses
import random

from phalanx.apps import kv_wire
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_types import Add
from phalanx.consensus.core import Core, Input, Ready, Receive, Tick
from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.leaderless.endorsement_batch import expand
from phalanx.consensus.leaderless.messages import (
    EndorsementBatch,
    Requirement,
    Transaction,
    transaction_id,
)
from phalanx.consensus.types import ClientRequest, Message, NodeId
from phalanx.jepsen.sim.invariants import InvariantChecker
from phalanx.jepsen.sim.leaderless import CLIENT_SECRET
from phalanx.jepsen.sim.loop import EventLoop, Trace
from phalanx.jepsen.sim.node import SIM_EPOCH_MS, SimNode
from phalanx.jepsen.sim.protocols import protocol_setup
from phalanx.protocols.leaderless_node import WireTxCodec
from phalanx.runtime.persistence import DurableState

MS = 1_000_000


class _Sink:
    answers_all = True

    def answer(self, node: str, client_id: str, request_no: int, result: bytes) -> None:
        pass

    def reject(self, node: str, request: ClientRequest, leader_hint: str | None) -> None:
        pass

    def abort(self, node: str, request: ClientRequest, reason: str) -> None:
        pass


class _Codec:
    def __init__(self, encode: object, decode: object) -> None:
        self.encode = encode
        self.decode = decode


def paused_past_a_deadline(fresh_clock: bool) -> tuple[list[Input], list[bytes], bytes]:
    """n1 of a 4-node leaderless setup ticks for 50 ms, is paused for 10 s, during which a
    peer relays a transaction due 100 ms into the pause, then resumes. Returns the inputs
    its core was stepped with, the ids of the transactions it endorsed, and the relayed
    transaction's id."""
    setup = protocol_setup("leaderless", bugs=frozenset(), nodes=4)
    loop = EventLoop()
    inputs: list[Input] = []
    endorsed: list[bytes] = []

    class Recording:
        def __init__(self, core: Core) -> None:
            self.core = core
            self.node_id = core.node_id

        def step(self, inp: Input, /) -> Ready:
            inputs.append(inp)
            return self.core.step(inp)

        def status(self) -> object:
            return self.core.status()

    def make_core(name: str, durable: DurableState, rng: random.Random) -> Core:
        return Recording(setup.make_core(name, durable, rng))  # type: ignore[return-value]

    def send(src: str, dst: str, message: Message) -> None:
        if isinstance(message, EndorsementBatch):
            expanded = expand(message)
            assert expanded is not None
            endorsed.extend(e.tx_id for e in expanded[1])

    registry = setup.codec
    node = SimNode("n1", loop=loop, rng=random.Random(1), trace=Trace(loop), send=send,
                   clients=_Sink(), checker=setup.checker or InvariantChecker(),
                   make_core=make_core, make_replica=setup.make_replica,
                   codec=_Codec(registry.encoder(), registry.decoder()),  # type: ignore[arg-type]
                   observe=setup.observe, tick_ns=10 * MS,
                   fresh_clock=fresh_clock)
    node.start()
    loop.run_until(50 * MS)
    node.pause()
    loop.run_until(10_050 * MS)
    codec = WireTxCodec()
    base = KvStateMachine().base_versions(("k",))[0]  # an absent key's (add needs it)
    body = Transaction(client="c0", client_id="c0", request_no=1,
                       deadline_ms=SIM_EPOCH_MS + 150,
                       requirements=(Requirement(key="k", version=base, base=True),),
                       command=kv_wire.encode_command(Add(key="k", amount=1)))
    signer = FastCrypto(NodeId("c0"), cluster_secret=CLIENT_SECRET)
    tx = dataclasses.replace(body, signature=signer.sign(body))
    node.deliver("n2", tx)
    node.resume()
    loop.run_until(10_100 * MS)
    return inputs, endorsed, transaction_id(tx, codec.encode)


def test_the_leaderless_spec_asks_for_a_fresh_clock_and_raft_and_pbft_do_not() -> None:
    assert protocol_setup("leaderless", bugs=frozenset(), nodes=4).deadline_clock
    assert not protocol_setup("raft", bugs=frozenset(), nodes=3).deadline_clock
    assert not protocol_setup("pbft", bugs=frozenset(), nodes=4).deadline_clock


def test_resume_steps_the_time_before_the_queued_message() -> None:
    inputs, endorsed, tx = paused_past_a_deadline(fresh_clock=True)
    index = next(i for i, inp in enumerate(inputs) if isinstance(inp, Receive))
    assert inputs[index - 1] == Tick(now_ms=SIM_EPOCH_MS + 10_050)
    assert tx not in endorsed  # its deadline passed during the pause


def test_without_it_the_resumed_node_endorses_an_expired_transaction() -> None:
    # The control: the core judged the deadline by its reading from before the pause.
    inputs, endorsed, tx = paused_past_a_deadline(fresh_clock=False)
    index = next(i for i, inp in enumerate(inputs) if isinstance(inp, Receive))
    assert inputs[index - 1] == Tick(now_ms=SIM_EPOCH_MS + 50)
    assert tx in endorsed
