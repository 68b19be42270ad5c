"""The attacker side of `bench/attack_handshakes.py`: a TLS connection flood against one client
port, run as its own process (so its CPU never shares the measuring process's GIL).

Owns: the flood loop and its counters. Three kinds of worker, all on loopback only:
- ``nocert``: connect, TLS handshake WITHOUT a client certificate (the node does all its
  handshake work, then refuses), close, repeat at once. The bulk of the flood.
- ``idle``: connect with a VALID client certificate, finish the handshake, then sit idle
  holding the connection until the flood ends (reconnect after 0.2 s if the node closes it).
- ``stall``: connect and send nothing (a half-open handshake that holds a pending slot until
  the node sheds it or times it out), repeat.
Bounded: at most `--nocert + --idle + --stall` sockets at once, for `--seconds`; each connect
and handshake has a deadline. Prints one JSON line of counters on stdout when done; progress
goes to stderr.

Usage (started by attack_handshakes.py): _flood.py --port P --ca CA --cert C --key K
  [--nocert 1400] [--idle 400] [--stall 200] [--seconds 20]
Must not be imported by the package.
"""

from __future__ import annotations

import argparse
import json
import resource
import ssl
import sys
import time
from collections import Counter

import trio

LOOPBACK = "127.0.0.1"
STEP_TIMEOUT = 5.0


def _context(ca: str, cert: str | None, key: str | None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = False
    context.load_verify_locations(cafile=ca)
    if cert is not None and key is not None:
        context.load_cert_chain(cert, key)
    return context


class Flood:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.counts: Counter[str] = Counter()
        self.idle_open = 0
        self.idle_peak = 0
        self.nocert_ctx = _context(args.ca, None, None)
        self.cert_ctx = _context(args.ca, args.cert, args.key)

    async def _connect(self) -> trio.SocketStream | None:
        try:
            with trio.fail_after(STEP_TIMEOUT):
                return await trio.open_tcp_stream(LOOPBACK, self.args.port)
        except (OSError, trio.TooSlowError):
            self.counts["connect_failed"] += 1
            await trio.sleep(0.05)  # e.g. out of ephemeral ports: do not spin
            return None

    async def nocert(self) -> None:
        while True:
            stream = await self._connect()
            if stream is None:
                continue
            self.counts["nocert_attempts"] += 1
            tls = trio.SSLStream(stream, self.nocert_ctx, server_hostname=None)
            try:
                with trio.fail_after(STEP_TIMEOUT):
                    await tls.do_handshake()
                    # TLS 1.3: the server checks the (missing) certificate after our side
                    # finished; its refusal arrives as the first read.
                    await tls.receive_some(1)
                self.counts["nocert_served"] += 1  # should not happen: no certificate
            except trio.TooSlowError:
                self.counts["nocert_timeouts"] += 1
            except trio.BrokenResourceError as e:
                cause = e.__cause__
                if isinstance(cause, ssl.SSLError) and "CERTIFICATE" in str(cause).upper():
                    self.counts["nocert_refused_by_tls"] += 1  # the full handshake was done
                else:
                    self.counts["nocert_closed_early"] += 1  # shed before or mid-handshake
            finally:
                await trio.aclose_forcefully(tls)

    async def idle(self) -> None:
        while True:
            stream = await self._connect()
            if stream is None:
                continue
            self.counts["idle_attempts"] += 1
            tls = trio.SSLStream(stream, self.cert_ctx, server_hostname=None)
            try:
                with trio.fail_after(STEP_TIMEOUT):
                    await tls.do_handshake()
                self.counts["idle_established"] += 1
                self.idle_open += 1
                self.idle_peak = max(self.idle_peak, self.idle_open)
                try:
                    while await tls.receive_some(4096):
                        pass
                finally:
                    self.idle_open -= 1
                self.counts["idle_closed_by_node"] += 1
            except trio.TooSlowError:
                self.counts["idle_timeouts"] += 1
            except trio.BrokenResourceError:
                self.counts["idle_closed_by_node"] += 1
            finally:
                await trio.aclose_forcefully(tls)
            await trio.sleep(0.2)

    async def stall(self) -> None:
        while True:
            stream = await self._connect()
            if stream is None:
                continue
            self.counts["stall_attempts"] += 1
            try:
                with trio.move_on_after(30):
                    await stream.receive_some(1)  # returns b"" once the node drops us
            except trio.BrokenResourceError:
                pass
            finally:
                await trio.aclose_forcefully(stream)

    async def progress(self, t0: float) -> None:
        while True:
            await trio.sleep(5)
            c = self.counts
            print(f"  flood {time.monotonic() - t0:4.0f} s: {c['nocert_attempts']:,} no-cert "
                  f"handshakes tried ({c['nocert_refused_by_tls']:,} refused after a full "
                  f"handshake, {c['nocert_closed_early']:,} shed), {self.idle_open} idle "
                  f"certified connections held, {c['stall_attempts']:,} stalls",
                  file=sys.stderr, flush=True)

    async def run(self) -> dict[str, int]:
        args = self.args
        t0 = time.monotonic()
        with trio.move_on_after(args.seconds):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.progress, t0)
                for _ in range(args.idle):
                    nursery.start_soon(self.idle)
                for _ in range(args.stall):
                    nursery.start_soon(self.stall)
                for _ in range(args.nocert):
                    nursery.start_soon(self.nocert)
        return {**self.counts, "idle_peak": self.idle_peak}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True, help="the target's client port (loopback)")
    p.add_argument("--ca", required=True, help="the cluster CA (to finish handshakes)")
    p.add_argument("--cert", required=True, help="a valid client certificate (idle workers)")
    p.add_argument("--key", required=True)
    p.add_argument("--nocert", type=int, default=1400, help="no-certificate handshake loops")
    p.add_argument("--idle", type=int, default=400, help="idle certified connections")
    p.add_argument("--stall", type=int, default=200, help="half-open (silent) connections")
    p.add_argument("--seconds", type=float, default=20.0)
    args = p.parse_args()
    total = args.nocert + args.idle + args.stall
    if not 0 < total <= 10_000 or min(args.nocert, args.idle, args.stall) < 0:
        sys.exit(f"_flood.py: need 1..10000 workers in all, got {total}")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < total + 64:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, total + 256), hard))
    print(json.dumps(trio.run(Flood(args).run)), flush=True)


if __name__ == "__main__":
    main()
