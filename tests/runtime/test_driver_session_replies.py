"""A retried write the replica already applied is answered from the session table at once
(a PBFT core never orders an executed request again, so without this the retry would wait
until the client's deadline); an older request number gets the "expired" error."""

from __future__ import annotations

import trio
from runtime_helpers import wait_for
from test_driver_pipeline import GatedCommitter, ScriptedCore, Sink, call, make_driver

from phalanx.consensus.types import ClientRequest, Entry, EntryKind
from phalanx.net.client_protocol import ClientReply, ReplyStatus


async def test_a_retry_of_an_applied_write_is_answered_from_the_session_table() -> None:
    core, committer, sent = ScriptedCore("backup"), GatedCommitter(), []
    driver = make_driver(core, committer, sent)
    request = ClientRequest(client_id="c", request_no=5, command=b"x")
    [applied] = driver.replica.apply(Entry(index=1, term=0, kind=EntryKind.COMMAND,
                                           requests=(request,)))
    sink = Sink()
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await driver.call(call(5), sink)  # the retry
        await driver.call(call(4), sink)  # older than the session's latest
        await driver.call(call(6), sink)  # new: goes to the core
        await wait_for(lambda: len(sink.replies) == 2 and len(core.proposals) == 1)
        nursery.cancel_scope.cancel()
    retry, old = sink.replies
    assert isinstance(retry, ClientReply)
    assert isinstance(old, ClientReply)
    assert (retry.request_no, retry.status, retry.result) == (5, ReplyStatus.OK, applied.result)
    assert (old.request_no, old.status) == (4, ReplyStatus.ERROR)
    assert "expired" in old.message
    assert [[r.request_no for r in p] for p in core.proposals] == [[6]]
    assert driver.stats.session_replies == 2
