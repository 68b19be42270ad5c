"""The compiled fast paths (`phalanx.net.codec_fast`) agree with the generic field walk they
shortcut, fall back to it for every error, and the per-thread Packer is safe to share."""

from __future__ import annotations

import threading

import msgpack
import pytest
from codec_samples import REGISTRY, Everything, messages, sample
from hypothesis import given, settings

from phalanx.net.codec import DecodeError, EncodeError, _Spec
from phalanx.net.codec_fast import pack


def spec_of(obj: object) -> _Spec:
    return REGISTRY._by_class[type(obj)]


@settings(deadline=None)
@given(messages)
def test_fast_paths_equal_the_generic_walk(obj: object) -> None:
    spec = spec_of(obj)
    fast = spec.encode(obj, 0)
    assert fast == spec.generic_encode(obj, 0)
    raw = msgpack.unpackb(pack(fast), raw=False)
    assert spec.decode(raw, 0) == spec.generic_decode(raw, 0) == obj


def test_fast_encode_falls_back_for_the_precise_error() -> None:
    bad = Everything.__new__(Everything)
    for f in Everything.__slots__:
        object.__setattr__(bad, f, getattr(sample(), f))
    object.__setattr__(bad, "n", 2**64)  # out of the msgpack range: the fast check fails
    with pytest.raises(EncodeError, match=r"Everything\.n"):
        REGISTRY.encode(bad)


def test_fast_decode_falls_back_for_the_precise_error() -> None:
    raw = msgpack.unpackb(REGISTRY.encode(sample()), raw=False)
    names = list(Everything.__slots__)
    raw[1 + names.index("n")] = "seven"
    with pytest.raises(DecodeError, match=r"Everything\.n: expected int, got str"):
        REGISTRY.decode(msgpack.packb(raw, use_bin_type=True))


def test_packer_per_thread_gives_identical_bytes() -> None:
    obj = sample()
    want = REGISTRY.encode(obj)
    seen: list[bytes] = []
    lock = threading.Lock()

    def work() -> None:
        got = [REGISTRY.encode(obj) for _ in range(300)]
        with lock:
            seen.extend(got)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 1200
    assert all(b == want for b in seen)
