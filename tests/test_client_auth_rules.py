"""`phalanx.runtime.client_auth`: which sessions a client owns and what each role may send."""

from __future__ import annotations

import pytest

from phalanx.consensus.types import ClientRequest
from phalanx.runtime.client_auth import Principal, owns_client_id, principal_from_peercert, refusal


@pytest.mark.parametrize(
    ("client_id", "owned"),
    [("alice", True), ("alice/1f", True), ("alice#3", True), ("alice/1f#3", True),
     ("alicex", False), ("alic", False), ("bob", False), ("", False), ("ALICE", False),
     ("bob/alice", False), ("alice.x", False)],
)
def test_a_client_owns_its_name_and_the_ids_below_it(client_id: str, owned: bool) -> None:
    assert owns_client_id("alice", client_id) is owned


@pytest.mark.parametrize(
    ("role", "read", "write"),
    [("read-only", True, False), ("read-write", True, True), ("admin", True, True)],
)
def test_roles_are_ordered(role: str, read: bool, write: bool) -> None:
    who = Principal(name="a", role=role)
    for read_only, allowed in ((True, read), (False, write)):
        request = ClientRequest(client_id="a/1", request_no=1, command=b"x",
                                read_only=read_only)
        assert (refusal(who, request) is None) is allowed


def test_a_refusal_quotes_a_bounded_part_of_the_id() -> None:
    request = ClientRequest(client_id="b" * 10_000, request_no=1, command=b"x")
    why = refusal(Principal(name="a", role="admin"), request)
    assert why is not None
    assert len(why) < 200


def test_only_a_client_certificate_is_a_principal() -> None:
    def cert(*uris: str) -> dict[str, object]:
        return {"subjectAltName": tuple(("URI", u) for u in uris)}

    assert principal_from_peercert(cert("urn:phalanx:client:a")) == Principal(
        name="a", role="read-write")
    assert principal_from_peercert(cert("urn:phalanx:node:n1")) is None
    assert principal_from_peercert(None) is None
    assert principal_from_peercert(cert("urn:phalanx:client:a", "urn:phalanx:role:x")) is None
