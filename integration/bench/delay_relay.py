#!/usr/bin/env python3
"""TCP relay that adds a one-way delay (and optional jitter) in both directions.

Puts distance between gatekeepers and the master on one machine: each
gatekeeper's accounting and control connections go through a relay port that
forwards to the master's endpoint. Every chunk read from one side is written to
the other side `delay` later; with jitter, each chunk's delay is drawn
uniformly from delay * (1 +- jitter), and never lets a chunk overtake the one
before it (TCP keeps order, so a late chunk delays those behind it, as a real
path with queueing does). End of stream is passed on after the data before it.

Unbounded buffering (no backpressure): meant for bounded benchmark traffic.

Usage:
  delay_relay.py [--delay-ms MS] [--jitter FRACTION] [--settings FILE] LISTEN:HOST:PORT ...

With --settings FILE, SIGHUP re-reads "delay_ms jitter" from FILE, so one relay
(and the connections through it) serves several delays in a row; chunks
already in flight keep the delay they were given. Listens on 127.0.0.1 only.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import signal
import socket


class Link:
    """The delay applied to every chunk; shared by all pumps."""

    def __init__(self, delay_ms: float, jitter: float):
        self.delay = delay_ms / 1000.0
        self.jitter = jitter
        self.rng = random.Random(12345)

    def sample(self) -> float:
        if self.jitter <= 0:
            return self.delay
        return max(0.0, self.delay * (1.0 + self.rng.uniform(-self.jitter, self.jitter)))


class Pump(asyncio.Protocol):
    """One direction's reading side; writes to `peer` (a transport) after the delay."""

    def __init__(self, link: Link):
        self.link = link
        self.peer: asyncio.Transport | None = None
        self.pending: list[bytes] = []  # read before the peer transport exists
        self.pending_eof = False
        self.last_due = 0.0
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _at_due(self, fn, *args):
        loop = asyncio.get_running_loop()
        now = loop.time()
        due = max(self.last_due, now + self.link.sample())
        self.last_due = due
        if due <= now:
            fn(*args)
        else:
            loop.call_at(due, fn, *args)

    def _write(self, data: bytes):
        if self.peer is None:
            self.pending.append(data)
        elif not self.peer.is_closing():
            self.peer.write(data)

    def _eof(self):
        if self.peer is None:
            self.pending_eof = True
        elif not self.peer.is_closing():
            self.peer.write_eof()

    def _close(self):
        if self.peer is not None:
            self.peer.close()

    def attach(self, peer: asyncio.Transport):
        self.peer = peer
        for data in self.pending:
            peer.write(data)
        self.pending.clear()
        if self.pending_eof:
            peer.write_eof()

    def data_received(self, data):
        self._at_due(self._write, data)

    def eof_received(self):
        self._at_due(self._eof)
        return True  # keep the write side open: the other direction may still flow

    def connection_lost(self, exc):
        self._at_due(self._close)


async def serve(listen: int, host: str, port: int, link: Link):
    loop = asyncio.get_running_loop()

    async def connect_upstream(down: Pump):
        try:
            _, up = await loop.create_connection(lambda: Pump(link), host, port)
        except OSError:
            down.transport.close()
            return
        if down.transport.is_closing():  # the client left while we connected
            up.transport.close()
            return
        down.attach(up.transport)  # client -> server
        up.attach(down.transport)  # server -> client

    def factory():
        down = Pump(link)
        orig = down.connection_made

        def made(transport):
            orig(transport)
            loop.create_task(connect_upstream(down))
        down.connection_made = made
        return down

    return await loop.create_server(factory, "127.0.0.1", listen, reuse_address=True, backlog=1024)


def read_settings(path: str, link: Link):
    with open(path) as f:
        parts = f.read().split()
    link.delay = float(parts[0]) / 1000.0
    link.jitter = float(parts[1]) if len(parts) > 1 else 0.0


async def main_async(args):
    link = Link(args.delay_ms, args.jitter)
    if args.settings:
        read_settings(args.settings, link)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    if args.settings:
        loop.add_signal_handler(signal.SIGHUP, read_settings, args.settings, link)
    servers = []
    for spec in args.routes:
        listen, host, port = spec.split(":")
        servers.append(await serve(int(listen), host, int(port), link))
    print("ready", flush=True)
    await stop.wait()
    for s in servers:
        s.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--jitter", type=float, default=0.0, help="fraction of the delay, e.g. 0.5 for +-50%%")
    ap.add_argument("--settings", help="file with 'delay_ms jitter', re-read on SIGHUP")
    ap.add_argument("routes", nargs="+", help="LISTEN_PORT:HOST:PORT")
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
