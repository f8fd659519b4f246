#!/usr/bin/env python3
"""Client side of benches/compare/run.sh: idle TLS connections and a check.

  idle_conns.py hold ADDR:PORT NAME CAFILE N SOURCES HOLD_S
      Opens N TLS 1.3 connections to ADDR:PORT (SNI NAME, the certificate
      verified against CAFILE, ALPN http/1.1), spread over the comma-separated
      SOURCES addresses (127.0.0.x: each source address has its own range of
      ephemeral ports), sends nothing on them, prints one line
      "OPEN opened=N failed=F seconds=S" once every attempt has ended, then
      holds them for HOLD_S seconds (the harness stops it by PID sooner, once
      it has read the proxy's memory) and exits.

  idle_conns.py check ADDR:PORT NAME CAFILE [PATH]
      One verified TLS 1.3 connection, one HTTP/1.1 GET PATH (default /); prints the
      negotiated TLS version, the HTTP status and the body length; exits 1
      on any failure. The harness runs it once per proxy before measuring,
      so a proxy that is misconfigured (wrong leaf, wrong CA, TLS 1.2) is
      caught before it produces figures.

Python's asyncio is enough here: the connections are idle, so the client
only pays for the handshakes, once.
"""

import asyncio
import ssl
import sys
import time


def context(cafile):
    ctx = ssl.create_default_context(cafile=cafile)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def split(addr):
    host, port = addr.rsplit(":", 1)
    return host, int(port)


async def hold(addr, name, cafile, n, sources, hold_s):
    host, port = split(addr)
    ctx = context(cafile)
    # At most 64 handshakes in flight: enough to keep the proxy busy, few
    # enough not to overflow its listen backlog or trip its handshake timeout.
    gate = asyncio.Semaphore(64)
    writers = []
    failed = 0
    errors = {}

    async def one(i):
        nonlocal failed
        async with gate:
            try:
                _, w = await asyncio.wait_for(
                    asyncio.open_connection(
                        host, port, ssl=ctx, server_hostname=name,
                        local_addr=(sources[i % len(sources)], 0)),
                    timeout=20)
                writers.append(w)
            except Exception as e:  # counted and reported, not fatal
                failed += 1
                key = type(e).__name__
                errors[key] = errors.get(key, 0) + 1

    t0 = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(n)))
    took = time.monotonic() - t0
    print(f"OPEN opened={len(writers)} failed={failed} seconds={took:.1f}"
          + "".join(f" {k}={v}" for k, v in sorted(errors.items())), flush=True)

    # Hold until the harness has read the proxy's memory and stops us by
    # PID; HOLD_S bounds the wait if it does not.
    await asyncio.sleep(hold_s)
    for w in writers:
        w.transport.abort()


async def check(addr, name, cafile, path):
    host, port = split(addr)
    r, w = await asyncio.wait_for(
        asyncio.open_connection(host, port, ssl=context(cafile), server_hostname=name),
        timeout=10)
    tls = w.get_extra_info("ssl_object")
    version, suite = tls.version(), tls.cipher()[0]
    w.write(f"GET {path} HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n".encode())
    await w.drain()
    data = await asyncio.wait_for(r.read(), timeout=10)
    w.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].decode(errors="replace")
    print(f"{version} {suite} {status} body={len(body)}B")
    if version != "TLSv1.3" or " 200 " not in status + " ":
        sys.exit(1)


def main():
    args = sys.argv[1:]
    if len(args) == 7 and args[0] == "hold":
        asyncio.run(hold(args[1], args[2], args[3], int(args[4]), args[5].split(","),
                         float(args[6])))
    elif len(args) in (4, 5) and args[0] == "check":
        asyncio.run(check(args[1], args[2], args[3], args[4] if len(args) == 5 else "/"))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
