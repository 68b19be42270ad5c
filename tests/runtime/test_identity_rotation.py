"""A data directory's cluster identity across a CA rotation (`phalanx.runtime.identity`):
a single-certificate CA file's identity is unchanged by the bundle format; a bundle vouches
for each of its CAs; a node adopts the newest, and another cluster's directory stays
refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.ops import pki
from phalanx.runtime.identity import (
    Identity,
    adopt_rotated_identity,
    cluster_fingerprint,
    read_identity,
    trusted_fingerprints,
    write_identity,
)


def test_a_bundle_vouches_for_each_ca_and_the_newest_is_adopted(tmp_path: Path) -> None:
    old, new, other = pki.create_ca(), pki.create_ca(), pki.create_ca()
    ca_file = tmp_path / "ca.pem"
    pki.write_trust(ca_file, [old.certificate])
    single = trusted_fingerprints(ca_file)
    assert set(single) == {cluster_fingerprint(ca_file)}  # the pre-rotation identity
    data = tmp_path / "data"
    write_identity(data, Identity(cluster=single[0], node="n1", state="member"),
                   durable=False)
    pki.write_trust(ca_file, [old.certificate, new.certificate])
    bundle = trusted_fingerprints(ca_file)
    assert single[0] in bundle
    assert bundle[-1] != single[0]
    assert adopt_rotated_identity(data, ca_file)
    identity = read_identity(data)
    assert identity == Identity(cluster=bundle[-1], node="n1", state="member")
    assert not adopt_rotated_identity(data, ca_file)  # already the newest
    pki.write_trust(ca_file, [new.certificate])  # finish: the old CA leaves the file
    assert trusted_fingerprints(ca_file)[-1] == bundle[-1]
    pki.write_trust(ca_file, [other.certificate])  # another cluster's CA
    assert not adopt_rotated_identity(data, ca_file)
    assert read_identity(data) == identity


def test_load_ca_finds_the_certificate_that_fits_the_key_in_a_bundle(tmp_path: Path) -> None:
    old, new = pki.create_ca(), pki.create_ca()
    pki.write_ca(new, tmp_path)
    pki.write_trust(tmp_path / "ca.pem", [old.certificate, new.certificate])
    assert pki.load_ca(tmp_path).certificate == new.certificate
    pki.write_trust(tmp_path / "ca.pem", [old.certificate])
    with pytest.raises(ValueError, match="does not match"):
        pki.load_ca(tmp_path)
