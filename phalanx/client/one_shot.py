"""One request and its answer over a short TLS connection of its own, for operator tools.

Owns: `ask_once`. The service and admin calls (`phalanx.client.service_calls`,
`phalanx.client.admin_calls`) are a few per second at most, so they dial per call instead
of sharing `phalanx.Client`'s pool. The answer is the first decoded frame that `accept`
maps to a value (its type and nonce: other frames are skipped); a connection closed first
or a garbled frame is a `ClientError` naming the node.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import TypeVar

import trio

from phalanx.client.errors import ClientError
from phalanx.consensus.types import Message
from phalanx.net import wire
from phalanx.net.codec import DecodeError
from phalanx.net.framing import FrameDecoder, FrameError, encode_frame
from phalanx.net.tls_stream import TlsStream
from phalanx.net.transport_dial import open_tcp_stream_to_other
from phalanx.ops.node_config import PeerConfig

T = TypeVar("T")
_RECEIVE = 64 * 1024


async def ask_once(node: PeerConfig, context: ssl.SSLContext, request: Message,
                   accept: Callable[[object], T | None]) -> T:
    """Send `request` to `node`'s client port and return `accept` of its answer."""
    tcp = await open_tcp_stream_to_other(node.client_addr.host, node.client_addr.port)
    tls = TlsStream(tcp, context)
    try:
        await tls.do_handshake()
        await tls.send_all(encode_frame(wire.encode(request)))
        decoder = FrameDecoder()
        while True:
            data = await tls.receive_some(_RECEIVE)
            if not data:
                raise ClientError(f"{node.id} closed the connection without an answer")
            decoder.feed(data)
            while (frame := decoder.next_frame()) is not None:
                answer = accept(wire.decode(frame))
                if answer is not None:
                    return answer
    except (DecodeError, FrameError) as e:
        raise ClientError(f"{node.id}: garbled answer ({e})") from None
    finally:
        await trio.aclose_forcefully(tls)
