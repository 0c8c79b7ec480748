"""WebSocket echo server on hypercorn (an ASGI app) for upkeep's HTTP/2 upstream upgrade tests.

Serves HTTP/2 (h2c by prior knowledge in clear text, ALPN h2 over TLS) with RFC 8441 extended
CONNECT, and HTTP/1.1 upgrades (ALPN http/1.1 over TLS).

usage: h2_ws_server.py [--no-connect-protocol] [--tls CERT KEY]
  --no-connect-protocol  its HTTP/2 SETTINGS do not announce ENABLE_CONNECT_PROTOCOL
  --tls CERT KEY         TLS with ALPN h2 and http/1.1

Prints its port on the first line, then one JSON line per WebSocket when it ends: the path,
the HTTP version it came over, the close code and reason the client sent, the messages
echoed. A message "close-me" makes the server close with 4001 "server says bye"; path
/refuse is answered 403 instead of accepted.
"""
import asyncio
import json
import socket
import sys

import h2.events
import h2.settings
from hypercorn.asyncio import serve
from hypercorn.config import Config
from hypercorn.protocol import h2 as hc_h2
from hypercorn.protocol.events import EndData, StreamClosed
from hypercorn.protocol import ws_stream
from wsproto.connection import ConnectionState
from wsproto.events import CloseConnection

args = sys.argv[1:]
if "--no-connect-protocol" in args:
    # hypercorn always announces it: take it out of the server's initial SETTINGS.
    init = h2.settings.Settings.__init__

    def without_connect_protocol(self, client=True, initial_values=None):
        values = dict(initial_values or {})
        values.pop(h2.settings.SettingCodes.ENABLE_CONNECT_PROTOCOL, None)
        init(self, client=client, initial_values=values)

    h2.settings.Settings.__init__ = without_connect_protocol

# hypercorn does not tell the app the close code the client sent; it answers the client's
# close frame with the same code, which is noted here in the connection's scope.
send_event = ws_stream.WSStream._send_wsproto_event


async def noting_close(self, event):
    if isinstance(event, CloseConnection) and self.connection.state == ConnectionState.REMOTE_CLOSING:
        self.scope["client_close"] = {"code": int(event.code), "reason": event.reason or ""}
    await send_event(self, event)


ws_stream.WSStream._send_wsproto_event = noting_close

# hypercorn 0.18 forgets a WebSocket stream once it has sent its own END_STREAM, and then fails
# the whole connection (KeyError in H2Protocol._handle_events) on a DATA frame for it, even
# the empty END_STREAM with which the peer closes its half, as RFC 9113 has it. Such frames
# are dropped here (their flow-control bytes still acknowledged), so one WebSocket's clean
# end does not take the shared connection down.
handle_events = hc_h2.H2Protocol._handle_events


async def tolerant(self, events):
    kept = []
    for e in events:
        if isinstance(e, h2.events.DataReceived) and e.stream_id not in self.streams:
            try:
                self.connection.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
            except Exception:
                pass
            continue
        kept.append(e)
    await handle_events(self, kept)


hc_h2.H2Protocol._handle_events = tolerant

# And when the client closes a WebSocket first, hypercorn answers its close frame and forgets
# the stream without ending it (no END_STREAM): the client, which waits for the server to end
# the connection after the close handshake (RFC 6455 §7.1.1), waits its close timeout. The
# stream is ended here as hypercorn ends it when the server closes first (EndData).
stream_send = hc_h2.H2Protocol.stream_send


async def ending_stream_send(self, event):
    buffer = self.stream_buffers.get(event.stream_id)
    if isinstance(event, StreamClosed) and buffer is not None and not buffer.complete:
        await stream_send(self, EndData(stream_id=event.stream_id))
    await stream_send(self, event)


hc_h2.H2Protocol.stream_send = ending_stream_send


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b"websocket only\n"})
        return
    await receive()  # websocket.connect
    if scope["path"] == "/refuse":
        await send({"type": "websocket.close"})
        return
    await send({"type": "websocket.accept"})
    echoed = 0
    while True:
        msg = await receive()
        if msg["type"] == "websocket.disconnect":
            break
        if msg.get("text") == "close-me":
            await send({"type": "websocket.close", "code": 4001, "reason": "server says bye"})
            break
        if msg.get("text") is not None:
            await send({"type": "websocket.send", "text": msg["text"]})
        else:
            await send({"type": "websocket.send", "bytes": msg["bytes"]})
        echoed += 1
    close = scope.get("client_close") or {}
    print(
        json.dumps(
            {
                "path": scope["path"],
                "http_version": scope["http_version"],
                "code": close.get("code"),
                "reason": close.get("reason"),
                "echoed": echoed,
            }
        ),
        flush=True,
    )


async def main():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.set_inheritable(True)
    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.accesslog = None
    config.errorlog = None
    if "--tls" in args:
        i = args.index("--tls")
        config.certfile, config.keyfile = args[i + 1], args[i + 2]
    print(sock.getsockname()[1], flush=True)
    await serve(app, config)


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
