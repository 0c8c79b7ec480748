"""WebSocket client (the `websockets` package) for upkeep's upgrade tests.

usage: ws_client.py URL MODE [N]
  echo N  send N text and N binary messages, check every echo, then close with 4002
          "client says bye"; then a second connection asks the server to close (4001)
  hold    send one message, then wait until the connection ends (printing how)
  refused expect the handshake to be refused; print the status
Prints one JSON line with what happened.
"""
import asyncio
import json
import os
import ssl
import sys
import time

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

# wss:// URLs: trust the CA in $WS_CA and check the name upkeep.test.
TLS = {}
if os.environ.get("WS_CA"):
    TLS = {"ssl": ssl.create_default_context(cafile=os.environ["WS_CA"]), "server_hostname": "upkeep.test"}


async def echo(url, n):
    # No compression: the byte counts checked are those of the messages as sent.
    async with connect(
        url, ping_interval=None, max_size=None, open_timeout=5, close_timeout=5, compression=None, **TLS
    ) as ws:
        texts = [f"message {i} " + "x" * (i % 50) for i in range(n)]
        blobs = [bytes([i % 256]) * (1 + i % 300) for i in range(n)]
        for t in texts:
            await ws.send(t)
        got_texts = [await ws.recv() for _ in range(n)]
        for b in blobs:
            await ws.send(b)
        got_blobs = [await ws.recv() for _ in range(n)]
        sent = sum(len(t) for t in texts) + sum(len(b) for b in blobs)
        ok = got_texts == texts and got_blobs == blobs
        await ws.close(4002, "client says bye")
        close = ws.protocol.close_sent
        client_close = {"code": int(close.code), "reason": str(close.reason)}
    async with connect(url, ping_interval=None, open_timeout=5, close_timeout=5, **TLS) as ws:
        await ws.send("close-me")
        try:
            await ws.recv()
            server_close = None
        except ConnectionClosed as e:
            server_close = (
                {"code": int(e.rcvd.code), "reason": str(e.rcvd.reason)} if e.rcvd else None
            )
    return {
        "ok": ok,
        "messages": 2 * n,
        "payload_bytes": sent,
        "client_close": client_close,
        "server_close": server_close,
    }


async def hold(url):
    async with connect(url, ping_interval=None, open_timeout=5, close_timeout=5) as ws:
        await ws.send("one")
        assert await ws.recv() == "one"
        print(json.dumps({"open": True}), flush=True)
        start = time.monotonic()
        try:
            await asyncio.wait_for(ws.recv(), 20)
            how = "message"
        except ConnectionClosed as e:
            how = "closed"
        except asyncio.TimeoutError:
            how = "still open"
        return {"how": how, "after_s": time.monotonic() - start}


async def refused(url):
    try:
        async with connect(url, open_timeout=5):
            return {"status": 101}
    except InvalidStatus as e:
        return {"status": e.response.status_code, "body": e.response.body.decode()}


async def main():
    url, mode = sys.argv[1], sys.argv[2]
    if mode == "echo":
        out = await echo(url, int(sys.argv[3]))
    elif mode == "hold":
        out = await hold(url)
    else:
        out = await refused(url)
    print(json.dumps(out), flush=True)


asyncio.run(main())
