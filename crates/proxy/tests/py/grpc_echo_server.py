"""A grpcio echo server for the proxy's gRPC tests: generic handlers on raw bytes (no codegen).

Binds 127.0.0.1:0, prints the port on stdout, serves until stdin closes.

Methods of /echo.Echo:
  Unary         answers b"echo:" + request, with trailing metadata x-trailer: done
  Fail          aborts FAILED_PRECONDITION "nope" with trailing metadata x-why: because
  Slow          sleeps float(request) seconds, then answers b"late"
  ServerStream  streams int(request) messages b"msg-<i>"
  ClientStream  answers the count and total size of the messages received, b"<n>:<bytes>"
  Bidi          answers every message as it arrives with b"re:" + message
  SlowStream    streams int(request) messages b"tick-<i>", 100 ms apart; when the call is
                cancelled under it (the client or a proxy reset the stream), prints
                "cancelled SlowStream after <i>" on stdout
"""

import sys
import time
from concurrent import futures

import grpc


def unary(request, context):
    context.set_trailing_metadata((("x-trailer", "done"),))
    return b"echo:" + request


def fail(request, context):
    context.set_trailing_metadata((("x-why", "because"),))
    context.abort(grpc.StatusCode.FAILED_PRECONDITION, "nope")


def slow(request, context):
    time.sleep(float(request.decode()))
    return b"late"


def server_stream(request, context):
    for i in range(int(request.decode())):
        yield b"msg-%d" % i


def slow_stream(request, context):
    # grpcio stops pulling from a cancelled call's iterator without always resuming it,
    # so the loop may never see the cancellation; the termination callback always runs.
    state = {"sent": 0, "finished": False}

    def on_end():
        if not state["finished"]:
            print("cancelled SlowStream after %d" % state["sent"], flush=True)

    context.add_callback(on_end)
    for i in range(int(request.decode())):
        if not context.is_active():
            return
        yield b"tick-%d" % i
        state["sent"] = i + 1
        time.sleep(0.1)
    state["finished"] = True


def client_stream(request_iterator, context):
    n = size = 0
    for m in request_iterator:
        n += 1
        size += len(m)
    return b"%d:%d" % (n, size)


def bidi(request_iterator, context):
    for m in request_iterator:
        yield b"re:" + m


def main():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "Fail": grpc.unary_unary_rpc_method_handler(fail),
        "Slow": grpc.unary_unary_rpc_method_handler(slow),
        "ServerStream": grpc.unary_stream_rpc_method_handler(server_stream),
        "SlowStream": grpc.unary_stream_rpc_method_handler(slow_stream),
        "ClientStream": grpc.stream_unary_rpc_method_handler(client_stream),
        "Bidi": grpc.stream_stream_rpc_method_handler(bidi),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("echo.Echo", handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    sys.stdin.read()
    server.stop(0)


if __name__ == "__main__":
    main()
