"""WebSocket echo round trips for bench/proxy.sh (the Python `websockets` package).

  ws.py serve            echo server on a free loopback port; prints the port
  ws.py load URL C SECS  C connections, each sending a 64-byte text message and awaiting its
                         echo, back to back, for SECS seconds; prints one JSON line:
                         round trips, per second, p50 and p99 in ms, errors
"""
import asyncio
import json
import sys
import time

from websockets.asyncio.client import connect
from websockets.asyncio.server import serve


async def echo(ws):
    async for msg in ws:
        await ws.send(msg)


async def server():
    async with serve(echo, "127.0.0.1", 0, ping_interval=None, compression=None) as s:
        print(s.sockets[0].getsockname()[1], flush=True)
        await asyncio.Future()


async def one(url, until, times, errors):
    try:
        async with connect(url, ping_interval=None, compression=None, open_timeout=5) as ws:
            msg = "x" * 64
            while time.monotonic() < until:
                t0 = time.perf_counter()
                await ws.send(msg)
                if await ws.recv() != msg:
                    errors.append("mismatch")
                    return
                times.append(time.perf_counter() - t0)
    except Exception as e:  # a failed connection is an error of the run, not of the script
        errors.append(repr(e))


async def load(url, conns, secs):
    times, errors = [], []
    until = time.monotonic() + secs
    await asyncio.gather(*(one(url, until, times, errors) for _ in range(conns)))
    times.sort()
    q = lambda p: times[min(len(times) - 1, int(p * len(times)))] * 1000 if times else 0
    print(json.dumps({"round_trips": len(times), "per_s": len(times) / secs,
                      "p50_ms": q(0.5), "p99_ms": q(0.99), "errors": len(errors)}), flush=True)


if sys.argv[1] == "serve":
    asyncio.run(server())
else:
    asyncio.run(load(sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
