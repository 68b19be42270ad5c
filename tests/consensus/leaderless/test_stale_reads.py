"""A committed read that can never pass the version gate here (docs/LEADERLESS.md, "A
committed read held at the version gate"): honest nodes apply read T (k@V) and then writer W
(k, requiring V, endorsed once T applied); a node that missed both and learns W's
certificate first applies W, after which T's requirement never holds there. The gate skips
T once its deadline is past (read-only: no state changes), so the node neither holds T
forever nor refuses every later transaction on k."""

from __future__ import annotations

import pytest
from leaderless_harness import Cluster, make_tx, tx_id, version

from phalanx.consensus.core import Receive
from phalanx.consensus.types import NodeId

N1, N4 = NodeId("n1"), NodeId("n4")


def _committed_everywhere_but_n4(c: Cluster, tid: bytes) -> bool:
    return all(tid in c.nodes[n].app.applied_ids or c.nodes[n].core._gate.proof(tid)
               for n in c.ids[:3])


@pytest.mark.parametrize("skip", [True, False])
def test_a_read_learned_after_its_writer_is_skipped_not_held(skip: bool) -> None:
    # delta_old_ms is the skip's grace: a huge one keeps the old behaviour (the control).
    c = Cluster(4, seed=5, delta_old_ms=1000 if skip else 10**9)
    c.tick()
    c.submit(make_tx("set k a", no=1, reqs={"k": version(None)}), to=(N1,))
    c.tick(rounds=5)
    assert c.states() == [{"k": b"a"}] * 4
    c.down = {N4}
    read = make_tx("get k", no=2, reqs={"k": version(b"a")}, read_only=True)
    c.submit(read, to=(N1,))
    c.tick(rounds=5)
    assert all(c.nodes[n].app.applied() == 2 for n in c.ids[:3])  # the read applied
    write = make_tx("set k b", no=3, reqs={"k": version(b"a")})
    c.submit(write, to=(N1,))
    c.tick(rounds=5)
    assert c.states()[:3] == [{"k": b"b"}] * 3
    # n4 comes back and learns W's certificate before anything about T.
    c.down = set()
    c.net = [(src, s) for src, s in c.net if s.to != N4]
    proof = c.nodes[N1].core._gate.proof(tx_id(write))
    assert proof is not None
    c.step(N4, Receive(src=N1, message=proof))
    assert c.states()[3] == {"k": b"b"}
    c.tick(rounds=100)  # anti-entropy brings T's certificate; 10 s: past T's deadline
    n4 = c.nodes[N4].core.status()
    assert c.now > read.deadline_ms + 1000
    if skip:
        assert (n4.gated, n4.skipped_reads) == (0, 1)
    else:
        assert (n4.gated, n4.skipped_reads) == (1, 0)
    # A later write of k while n1 is down: committing it needs Q = 3 endorsements, so n4
    # must endorse it, which a read held at its gate forbids.
    c.down = {N1}
    later = make_tx("set k c", no=4, deadline=c.now + 5000, reqs={"k": version(b"b")})
    c.submit(later, to=(N4,))
    c.tick(rounds=10)
    expected = b"c" if skip else b"b"
    assert c.states()[1:] == [{"k": expected}] * 3
    assert _committed_everywhere_but_n4(c, tx_id(read))


def test_a_writer_requiring_a_key_it_does_not_write_is_never_endorsed() -> None:
    """T writes j and requires k@V; W writes k requiring V after T applied. Both could
    commit, and a node learning W first could never apply T: T's write of j would be lost
    there. So a correct node never endorses such a T (it aborts at its deadline); a writer
    requiring only keys it writes commits as usual."""
    c = Cluster(4, seed=7)
    c.tick()
    c.submit(make_tx("set k a", no=1, reqs={"k": version(None)}), to=(N1,))
    c.tick(rounds=5)
    odd = make_tx("set j 1", no=2, reqs={"j": version(None), "k": version(b"a")})
    c.submit(odd, to=(N1,))
    c.tick(rounds=80)  # 8 s: past its deadline
    assert c.states() == [{"k": b"a"}] * 4
    assert all(n.core.status().committed == 1 for n in c.nodes.values())
    assert [a.request.request_no for a in c.nodes[N1].aborted] == [2]
    fine = make_tx("set j 2", no=3, deadline=c.now + 5000, reqs={"j": version(None)})
    c.submit(fine, to=(N1,))
    c.tick(rounds=5)
    assert c.states() == [{"k": b"a", "j": b"2"}] * 4
