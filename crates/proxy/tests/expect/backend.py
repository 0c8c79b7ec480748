"""An HTTP/1.1 backend (Python's http.server) that decides on Expect: 100-continue itself.

Prints its port, then one JSON line per request. /refuse... answers 401 and a body larger
than 1 MB gets 413, both before reading the body, and the line records how many bytes arrived
on the connection in the second after the refusal (none, when the body was held back). Any
other POST gets 100 Continue (http.server's own), then its body, answered "got N".
"""
import http.server
import json


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def record(self, **kw):
        print(json.dumps(dict(path=self.path, expect=self.headers.get("Expect"), **kw)), flush=True)

    def handle_expect_100(self):
        length = int(self.headers.get("Content-Length") or 0)
        refuse = self.path.startswith("/refuse")
        if refuse or length > 1_000_000:
            status = 401 if refuse else 413
            body = b"not this one\n"
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
            self.connection.settimeout(1.0)
            try:
                after = len(self.rfile.read1(1 << 20))
            except OSError:
                after = 0
            self.record(status=status, body_after_refusal=after)
            self.close_connection = True
            return False
        return super().handle_expect_100()

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(length)
        body = f"got {len(data)}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.record(status=200, received=len(data))


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
