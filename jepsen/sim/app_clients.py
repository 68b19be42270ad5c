"""Your own state machine in the simulator: `phalanx sim --app FILE.py:FACTORY`.

Owns: `app_setup(setup, machine)` (a protocol's setup with the app's clients as its
`ProtocolSetup.workload`) and `AppWorkload`, closed-loop clients that send the commands the
app's `random_command` draws (`phalanx.apps.command_source`) and record a history, then
check, at the end of the run:

- linearizability of that history against the app's sequential model
  (`phalanx.jepsen.app_model.MachineModel`: its `reference_model()`, else the app itself);
- replica convergence: every honest replica at the highest applied index holds the same
  state (its snapshot bytes' digest): a machine that is not deterministic diverges here;
- liveness: every operation pending when the clients stop completes by the end of the run.

Clients as `phalanx.jepsen.sim.clients.SimClient` does (same request number on every
retry; an answer is ``ok``; an abort ``fail``; the operation's deadline ``info``, after
which the client goes on as a fresh process with a fresh session). Where a request goes:
under matching replies (BFT) where the setup's `ReplyFilter` says, and a result needs f+1
matching replies; otherwise to the node the target's core names as leader (what a
rejection's hint tells a real client), the next node after each attempt timeout.

Rules: all randomness from the run's generator (`WorkloadEnv.rng`), time from its loop.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from phalanx.apps.command_source import CommandSource, command_source
from phalanx.apps.interface import StateMachine
from phalanx.consensus.types import ClientRequest
from phalanx.jepsen.app_model import APPLY, QUERY, model_of, state_digest, to_text
from phalanx.jepsen.history import FAIL, INFO, OK, HistoryRecorder
from phalanx.jepsen.sim.protocols import ProtocolSetup, ReplyFilter, WorkloadEnv

MS: Final = 1_000_000
ATTEMPT_NS: Final = 60 * MS
OP_NS: Final = 600 * MS
THINK_NS: Final = 10 * MS
LIN_STEP_LIMIT: Final = 20_000
_ABORTED: Final = b"\x00phalanx:aborted"


def app_setup(setup: ProtocolSetup, machine: Callable[[], StateMachine],
              reference: str) -> ProtocolSetup:
    """`setup` (whose replicas already run `machine`) with `AppWorkload` as its clients.
    Raises ValueError when the app cannot be tested (no `random_command`)."""
    try:
        probe = command_source(machine())
    except TypeError as e:
        raise ValueError(f"--app {reference}: {e}") from None
    if probe is None:
        raise ValueError(f"--app {reference}: the machine has no random_command(rng), so "
                         "the simulator has nothing to send it (docs/STATE_MACHINES.md, "
                         "\"Test it\")")
    model = model_of(machine)
    if setup.workload is not None:
        raise ValueError("this protocol's simulator runs its own workload: it cannot drive "
                         f"--app {reference}")

    def workload(env: WorkloadEnv) -> AppWorkload:
        return AppWorkload(env, source=probe, model=model, replies=setup.replies,
                           byzantine=frozenset(setup.byzantine))

    return dataclasses.replace(setup, workload=workload,
                               description=(setup.description + "; " if setup.description
                                            else "") + f"app: {reference}")


@dataclass(slots=True)
class _Op:
    client: int
    request: ClientRequest
    target: str
    deadline_ns: int
    attempt: int = 0


class AppWorkload:
    """`SimWorkload` of a custom app (see the module docstring)."""

    def __init__(self, env: WorkloadEnv, *, source: CommandSource,
                 model: Callable[[], StateMachine], replies: ReplyFilter | None,
                 byzantine: frozenset[str] = frozenset()) -> None:
        self.env = env
        self.byzantine = byzantine
        """Replicas that may lie: their states are not compared."""
        self.source = source
        self.model = model
        self.replies = replies
        self.names = tuple(env.nodes)
        self.recorder = HistoryRecorder()
        self.rngs = [random.Random(env.rng.getrandbits(64)) for _ in range(env.clients)]
        self.process = list(range(env.clients))
        self.generation = [0] * env.clients
        self.request_no = [0] * env.clients
        self.pending: dict[int, _Op] = {}
        self.running = False
        self.final_ns: int | None = None
        self._ok = 0
        self._infos = 0
        self._stuck: list[str] = []
        self._latencies: list[int] = []
        self._times: list[tuple[int, int]] = []
        self._invoked: dict[int, int] = {}

    # -- SimWorkload --------------------------------------------------------------------------

    @property
    def ok(self) -> int:
        return self._ok

    @property
    def infos(self) -> int:
        return self._infos

    def start(self) -> None:
        self.running = True
        for c in range(len(self.rngs)):
            self._later(c)

    def stop(self, final_ns: int) -> None:
        self.running = False
        self.final_ns = final_ns
        for op in self.pending.values():
            op.deadline_ns = final_ns
            self.env.loop.call_at(final_ns, self._deadline(op))

    def answer(self, node: str, client_id: str, request_no: int, result: bytes) -> None:
        op = self._find(client_id, request_no)
        if op is None:
            return
        if self.replies is not None:
            accepted = self.replies.reply(node, client_id, request_no, result)
            if accepted is None:
                return
            if accepted == _ABORTED:
                self._finish(op, FAIL, error="aborted")
                return
            result = accepted
        self._finish(op, OK, result=result)

    def abort(self, node: str, client_id: str, request_no: int) -> None:
        if self.replies is not None:  # one replica's word is no proof: f+1 matching
            self.answer(node, client_id, request_no, _ABORTED)
            return
        op = self._find(client_id, request_no)
        if op is not None:
            self._finish(op, FAIL, error="aborted")

    def check(self) -> list[str]:
        from phalanx.jepsen.app_model import check_app_history

        out = [f"liveness: {s}" for s in self._stuck]
        result = check_app_history(self.recorder.history(), self.model, time_limit=None,
                                   step_limit=LIN_STEP_LIMIT, stats=False)
        lin = result.linearizability
        if lin is not None and lin.valid is False:
            out.append("linearizability: the app's history is not linearizable on keys "
                       f"{list(lin.failing_keys)}: " + "; ".join(lin.explain())[:800])
        out += self._convergence()
        return out

    def commit_latencies_ns(self) -> tuple[int, ...]:
        return tuple(self._latencies)

    def commit_times_ns(self) -> tuple[tuple[int, int], ...]:
        return tuple(self._times)

    # -- convergence --------------------------------------------------------------------------

    def _convergence(self) -> list[str]:
        at: dict[int, dict[str, str]] = {}
        for name, node in self.env.nodes.items():
            replica = node.replica
            if replica is not None and name not in self.byzantine:
                digest = state_digest(replica.machine)
                at.setdefault(replica.applied_index, {})[name] = digest
        if not at:
            return []
        top = max(at)
        digests = at[top]
        if len(set(digests.values())) <= 1:
            return []
        shown = ", ".join(f"{n} {d}" for n, d in sorted(digests.items()))
        return [f"divergence: replicas at applied index {top} hold different states ({shown}):"
                " is the app deterministic?"]

    # -- clients ------------------------------------------------------------------------------

    def _session(self, c: int) -> str:
        return f"a{c}.{self.generation[c]}"

    def _find(self, client_id: str, request_no: int) -> _Op | None:
        c_text, _, _ = client_id[1:].partition(".")
        if not c_text.isdigit():
            return None
        op = self.pending.get(int(c_text))
        if op is None or op.request.client_id != client_id or op.request.request_no != request_no:
            return None
        return op

    def _later(self, c: int) -> None:
        self.env.loop.call_later(self.rngs[c].randrange(THINK_NS + 1), lambda: self._issue(c))

    def _issue(self, c: int) -> None:
        if not self.running or c in self.pending:
            return
        generated = self.source.random_command(self.rngs[c])
        self.request_no[c] += 1
        request = ClientRequest(client_id=self._session(c), request_no=self.request_no[c],
                                command=generated.command, read_only=generated.read_only)
        now = self.env.loop.now
        self.recorder.invoke(process=self.process[c], f=QUERY if generated.read_only else APPLY,
                             key=generated.key or None, value=to_text(generated.command),
                             time=now)
        if self.replies is not None:
            self.replies.record(request)
        op = _Op(client=c, request=request, target=self.names[c % len(self.names)],
                 deadline_ns=now + OP_NS)
        self.pending[c] = op
        self._invoked[c] = now
        self.env.loop.call_at(op.deadline_ns, self._deadline(op))
        self._send(op)

    def _send(self, op: _Op) -> None:
        op.attempt += 1
        attempt = op.attempt
        for node in self._targets(op):
            self.env.submit(node, op.request)
        self.env.loop.call_later(ATTEMPT_NS, lambda: self._retry(op, attempt))

    def _targets(self, op: _Op) -> tuple[str, ...]:
        cores = [self.env.nodes[n].core for n in self.names]
        if self.replies is not None:
            claims = [None if core is None else core.status().leader for core in cores]
            return self.replies.targets(op.request, claims)
        core = self.env.nodes[op.target].core
        hint = None if core is None else core.status().leader
        if hint is not None and hint in self.env.nodes:
            op.target = hint
        return (op.target,)

    def _retry(self, op: _Op, attempt: int) -> None:
        if self.pending.get(op.client) is not op or op.attempt != attempt:
            return
        i = self.names.index(op.target)
        op.target = self.names[(i + 1) % len(self.names)]
        self._send(op)

    def _deadline(self, op: _Op) -> Callable[[], None]:
        def fire() -> None:
            if self.pending.get(op.client) is not op or self.env.loop.now < op.deadline_ns:
                return
            if self.final_ns is not None:
                self._stuck.append(f"client {op.request.client_id} req#"
                                   f"{op.request.request_no} still pending at the end")
            self._finish(op, INFO, error="timeout")

        return fire

    def _finish(self, op: _Op, kind: str, *, result: bytes | None = None,
                error: str | None = None) -> None:
        c = op.client
        del self.pending[c]
        now = self.env.loop.now
        extra: dict[str, object] = {}
        if kind == OK and result is not None:
            extra["value"] = (to_text(op.request.command), to_text(result))
            self._ok += 1
            self._latencies.append(now - self._invoked[c])
            self._times.append((self._invoked[c], now))
        self.recorder.complete(process=self.process[c], type=kind,  # type: ignore[arg-type]
                               time=now, error=error, node=op.target,
                               **extra)  # type: ignore[arg-type]
        if kind == INFO:
            self._infos += 1
            self.process[c] += 1_000  # a fresh process (Jepsen's rule) and a fresh session
            self.generation[c] += 1
            self.request_no[c] = 0
        if self.running:
            self._later(c)
