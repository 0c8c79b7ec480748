"""How header fields travel in HPACK (the `h2` library, which keeps a field's representation:
a literal never indexed decodes as `hpack.NeverIndexedHeaderTuple`, `indexable` False).

    hpack_probe.py h2-server   an HTTP/2 backend (h2c, prior knowledge)
    hpack_probe.py h1-server   an HTTP/1.1 backend (http.server)
    hpack_probe.py client PORT PATH N NAME=VALUE...
                               N requests on one h2c connection to 127.0.0.1:PORT

A server prints its port, then one JSON line per request: its path, the request id and the
names of the fields that came never indexed (h2-server). It answers 200 "ok", echoing
`x-request-id` (not to a path with "no-id") and `traceparent`, and adding `x-plain: same`.
The client prints one JSON line: for each response, its status, its x-request-id, and the
names of the fields that came never indexed.
"""
import http.server
import json
import socket
import socketserver
import sys

import h2.config
import h2.connection
import h2.events

ECHOED = ("x-request-id", "traceparent")


def never_indexed(headers):
    return sorted(h[0] for h in headers if not h.indexable)


def answer_headers(request):
    h = dict(request)
    out = [(":status", "200"), ("content-length", "2"), ("x-plain", "same")]
    # A path with "no-id" gets the trace context back without the request id.
    echoed = [n for n in ECHOED if not (n == "x-request-id" and "no-id" in h.get(":path", ""))]
    out += [(n, h[n]) for n in echoed if n in h]
    return out


class H2Handler(socketserver.BaseRequestHandler):
    def handle(self):
        conn = h2.connection.H2Connection(
            config=h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        )
        conn.initiate_connection()
        self.request.sendall(conn.data_to_send())
        while data := self.request.recv(65536):
            for ev in conn.receive_data(data):
                if isinstance(ev, h2.events.RequestReceived):
                    h = dict(ev.headers)
                    print(json.dumps(dict(path=h.get(":path"), request_id=h.get("x-request-id"),
                                          never_indexed=never_indexed(ev.headers))),
                          flush=True)
                    conn.send_headers(ev.stream_id, answer_headers(ev.headers))
                    conn.send_data(ev.stream_id, b"ok", end_stream=True)
                elif isinstance(ev, h2.events.DataReceived):
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            self.request.sendall(conn.data_to_send())


class H1Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        fields = [(":path", self.path)] + [(n.lower(), v) for n, v in self.headers.items()]
        print(json.dumps(dict(path=self.path, request_id=self.headers.get("x-request-id"),
                              never_indexed=[])), flush=True)
        self.send_response(200)
        for n, v in answer_headers(fields)[1:]:
            self.send_header(n, v)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


def serve(server):
    print(server.server_address[1], flush=True)
    server.serve_forever()


def client(port, path, n, fields):
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    conn = h2.connection.H2Connection(
        config=h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
    )
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    results = []
    for i in range(n):
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, [(":method", "GET"), (":path", path), (":scheme", "http"),
                                (":authority", "hpack.test")] + fields, end_stream=True)
        sock.sendall(conn.data_to_send())
        result = None
        done = False
        while not done:
            data = sock.recv(65536)
            if not data:
                raise SystemExit("connection closed")
            for ev in conn.receive_data(data):
                if isinstance(ev, h2.events.ResponseReceived) and ev.stream_id == sid:
                    h = dict(ev.headers)
                    result = dict(status=int(h[":status"]), request_id=h.get("x-request-id"),
                                  never_indexed=never_indexed(ev.headers))
                elif isinstance(ev, h2.events.DataReceived):
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                if isinstance(ev, h2.events.StreamEnded) and ev.stream_id == sid:
                    done = True
            sock.sendall(conn.data_to_send())
        results.append(result)
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "h2-server":
        serve(socketserver.ThreadingTCPServer(("127.0.0.1", 0), H2Handler))
    elif mode == "h1-server":
        serve(http.server.ThreadingHTTPServer(("127.0.0.1", 0), H1Handler))
    else:
        fields = [tuple(a.split("=", 1)) for a in sys.argv[5:]]
        client(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), fields)
