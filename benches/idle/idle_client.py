#!/usr/bin/env python3
"""Client side of benches/idle/run.sh: N idle TLS 1.3 connections.

  idle_client.py ADDR:PORT NAME CAFILE N SOURCES ALPN HOLD_S

Like benches/compare/idle_conns.py's `hold`, with the ALPN protocol chosen:
  http1    offers http/1.1 and sends nothing after the handshake (what
           idle_conns.py does);
  h2       offers h2 and, as every HTTP/2 client does at once, sends the
           connection preface and an empty SETTINGS frame, then nothing;
  h2bare   offers h2 and sends nothing at all (the server is left waiting
           for the preface).
Prints "OPEN opened=N failed=F seconds=S alpn=P" once every attempt has
ended, then holds the connections for HOLD_S seconds (the harness stops it
by PID sooner) and exits.
"""

import asyncio
import ssl
import sys
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


async def hold(addr, name, cafile, n, sources, mode, hold_s):
    host, port = addr.rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=cafile)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.set_alpn_protocols(["http/1.1"] if mode == "http1" else ["h2"])
    gate = asyncio.Semaphore(64)
    conns = []
    failed = 0
    errors = {}
    alpn = set()

    async def one(i):
        nonlocal failed
        async with gate:
            try:
                r, w = await asyncio.wait_for(
                    asyncio.open_connection(
                        host, int(port), ssl=ctx, server_hostname=name,
                        local_addr=(sources[i % len(sources)], 0)),
                    timeout=20)
                alpn.add(w.get_extra_info("ssl_object").selected_alpn_protocol())
                if mode == "h2":
                    w.write(PREFACE)
                    await w.drain()
                conns.append((r, w))
            except Exception as e:  # counted and reported, not fatal
                failed += 1
                key = type(e).__name__
                errors[key] = errors.get(key, 0) + 1

    t0 = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(n)))
    took = time.monotonic() - t0
    print(f"OPEN opened={len(conns)} failed={failed} seconds={took:.1f}"
          f" alpn={','.join(sorted(str(a) for a in alpn))}"
          + "".join(f" {k}={v}" for k, v in sorted(errors.items())), flush=True)
    await asyncio.sleep(hold_s)
    for _, w in conns:
        w.transport.abort()


def main():
    a = sys.argv[1:]
    if len(a) != 7 or a[5] not in ("http1", "h2", "h2bare"):
        sys.exit(__doc__)
    asyncio.run(hold(a[0], a[1], a[2], int(a[3]), a[4].split(","), a[5], float(a[6])))


if __name__ == "__main__":
    main()
