"""An HTTP/2 backend (h2c, prior knowledge; the `h2` library) that decides on
Expect: 100-continue itself.

Prints its port, then one JSON line per request. /refuse... answers 401 before reading the
body and records how many body bytes arrived in the second after its refusal (none, when the
body was held back). Any other request with Expect: 100-continue gets a 100 at once, then its
body is read and answered "got N".
"""
import asyncio
import json

import h2.config
import h2.connection
import h2.events


class Conn:
    def __init__(self, reader, writer):
        self.reader = reader
        self.writer = writer
        self.h2 = h2.connection.H2Connection(
            config=h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        )
        self.streams = {}

    def flush(self):
        self.writer.write(self.h2.data_to_send())

    def answer(self, sid, status, body):
        self.h2.send_headers(
            sid, [(":status", str(status)), ("content-length", str(len(body)))]
        )
        self.h2.send_data(sid, body, end_stream=True)
        self.flush()

    async def refused(self, sid, st):
        await asyncio.sleep(1.0)
        print(json.dumps(dict(path=st["path"], expect=st["expect"], status=401,
                              body_after_refusal=st["received"])), flush=True)

    async def run(self):
        self.h2.initiate_connection()
        self.flush()
        while True:
            data = await self.reader.read(65536)
            if not data:
                return
            for ev in self.h2.receive_data(data):
                if isinstance(ev, h2.events.RequestReceived):
                    h = dict(ev.headers)
                    st = dict(path=h.get(":path"), expect=h.get("expect"), received=0,
                              refused=False)
                    self.streams[ev.stream_id] = st
                    if st["expect"] == "100-continue":
                        if st["path"].startswith("/refuse"):
                            st["refused"] = True
                            self.answer(ev.stream_id, 401, b"not this one\n")
                            asyncio.ensure_future(self.refused(ev.stream_id, st))
                        else:
                            self.h2.send_headers(ev.stream_id, [(":status", "100")])
                    if ev.stream_ended and not st["refused"]:
                        self.done(ev.stream_id, st)
                elif isinstance(ev, h2.events.DataReceived):
                    self.h2.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                    st = self.streams.get(ev.stream_id)
                    if st is not None:
                        st["received"] += len(ev.data)
                        if ev.stream_ended and not st["refused"]:
                            self.done(ev.stream_id, st)
                elif isinstance(ev, h2.events.StreamEnded):
                    pass
                elif isinstance(ev, h2.events.StreamReset):
                    self.streams.pop(ev.stream_id, None)
            self.flush()

    def done(self, sid, st):
        self.answer(sid, 200, f"got {st['received']}\n".encode())
        print(json.dumps(dict(path=st["path"], expect=st["expect"], status=200,
                              received=st["received"])), flush=True)


async def main():
    async def handle(reader, writer):
        try:
            await Conn(reader, writer).run()
        except Exception:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


asyncio.run(main())
