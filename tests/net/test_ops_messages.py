"""The operator calls' wire types (`phalanx.ops.ops_messages`, ids 712-715): registered in the
admin range, idempotently, and every field survives the codec; a refusal has the call's
reply type."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.net import client_protocol, wire
from phalanx.net.client_protocol import ReplyStatus
from phalanx.ops import ops_messages
from phalanx.ops.ops_messages import (
    OPS_MESSAGES,
    BackupCall,
    BackupReply,
    ReloadCall,
    ReloadReply,
    refusal,
)

client_protocol.register()
ops_messages.register()
ops_messages.register()  # idempotent

_ints = st.integers(0, 2**63 - 1)
_text = st.text(max_size=40)


def test_ids_are_712_to_715_in_the_admin_range() -> None:
    assert sorted(OPS_MESSAGES) == [712, 713, 714, 715]
    assert all(i in wire.RANGES["admin"] for i in OPS_MESSAGES)


@settings(max_examples=50, deadline=None)
@given(st.one_of(
    st.builds(BackupCall, nonce=_ints, min_index=_ints, index=_ints, offset=_ints,
              length=_ints),
    st.builds(BackupReply, nonce=_ints, status=st.sampled_from(ReplyStatus), message=_text,
              node=_text, index=_ints, term=_ints, meta=st.binary(max_size=40),
              data_bytes=_ints, data_sha256=_text, offset=_ints, chunk=st.binary(max_size=99)),
    st.builds(ReloadCall, nonce=_ints),
    st.builds(ReloadReply, nonce=_ints, status=st.sampled_from(ReplyStatus), message=_text,
              node=_text, not_after=_text)))
def test_every_field_survives_the_codec(message: object) -> None:
    assert wire.decode(wire.encode(message)) == message


def test_a_refusal_answers_with_the_calls_reply_type() -> None:
    assert refusal(BackupCall(nonce=3), "n1", "no") == BackupReply(
        nonce=3, status=ReplyStatus.ERROR, message="no", node="n1")
    assert refusal(ReloadCall(nonce=4), "n2", "no", ReplyStatus.FORBIDDEN) == ReloadReply(
        nonce=4, status=ReplyStatus.FORBIDDEN, message="no", node="n2")
