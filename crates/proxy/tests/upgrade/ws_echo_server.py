"""WebSocket echo server (the `websockets` package) for upkeep's upgrade tests.

Prints its port on the first line, then one JSON line per connection when it closes:
the path, the close code and reason it received, and the messages it echoed.
Path /refuse answers 403 instead of switching protocols. A message "close-me" makes the
server close with code 4001 and reason "server says bye".
"""
import asyncio
import http
import json
import sys

from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed


def process_request(connection, request):
    if request.path == "/refuse":
        return connection.respond(http.HTTPStatus.FORBIDDEN, "upgrade refused here\n")
    return None


async def handler(ws):
    echoed = 0
    try:
        async for msg in ws:
            if msg == "close-me":
                await ws.close(4001, "server says bye")
                break
            await ws.send(msg)
            echoed += 1
    except ConnectionClosed:
        pass
    rcvd = ws.protocol.close_rcvd
    print(
        json.dumps(
            {
                "path": ws.request.path,
                "code": int(rcvd.code) if rcvd else None,
                "reason": str(rcvd.reason) if rcvd else None,
                "echoed": echoed,
                "upgrade": ws.request.headers.get("Upgrade"),
            }
        ),
        flush=True,
    )


async def main():
    async with serve(
        handler, "127.0.0.1", 0, process_request=process_request, ping_interval=None, max_size=None
    ) as server:
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.Future()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
