"""A grpcio client for the proxy's gRPC tests: `grpc_echo_client.py ADDR CASE`, prints one JSON
object with what the client saw (code, details, messages, trailing metadata)."""

import json
import sys
import threading

import grpc


def metadata(md):
    return {k: v for k, v in (md or ()) if not k.endswith("-bin")}


def outcome(fn):
    try:
        result = fn()
        return {"code": "OK", "result": result}
    except grpc.RpcError as e:
        return {
            "code": e.code().name,
            "details": e.details(),
            "trailing": metadata(e.trailing_metadata()),
        }


def main():
    addr, case = sys.argv[1], sys.argv[2]
    channel = grpc.insecure_channel(addr)
    m = lambda kind, name: getattr(channel, kind)("/echo.Echo/" + name)
    timeout = 10.0
    if case == "unary":

        def run():
            reply, call = m("unary_unary", "Unary").with_call(b"hi", timeout=timeout)
            return {"reply": reply.decode(), "trailing": metadata(call.trailing_metadata())}

    elif case == "fail":

        def run():
            return m("unary_unary", "Fail")(b"x", timeout=timeout).decode()

    elif case == "slow":

        def run():
            return m("unary_unary", "Slow")(b"3", timeout=timeout).decode()

    elif case == "server_stream":

        def run():
            return [r.decode() for r in m("unary_stream", "ServerStream")(b"50", timeout=timeout)]

    elif case == "slow_stream":
        # No client deadline shorter than the stream: only upkeep's can end it. The messages
        # seen before the end are reported with the status.
        got = []

        def run():
            try:
                for r in m("unary_stream", "SlowStream")(b"100", timeout=timeout):
                    got.append(r.decode())
            except grpc.RpcError as e:
                print(json.dumps({
                    "code": e.code().name,
                    "details": e.details(),
                    "trailing": metadata(e.trailing_metadata()),
                    "messages": got,
                }), flush=True)
                raise SystemExit(0)
            return got

    elif case == "client_stream":

        def run():
            return m("stream_unary", "ClientStream")((b"x" * i for i in range(1, 101)), timeout=timeout).decode()

    elif case == "bidi":

        def run():
            # Each message is sent only after the answer to the previous one arrived: the
            # stream is interactive end to end, not buffered.
            got = []
            ready = threading.Event()
            ready.set()
            state = {"i": 0}

            def requests():
                for i in range(20):
                    if not ready.wait(5):
                        return
                    ready.clear()
                    yield b"m%d" % i

            for r in m("stream_stream", "Bidi")(requests(), timeout=timeout):
                got.append(r.decode())
                ready.set()
            return got

    else:
        raise SystemExit("unknown case " + case)
    print(json.dumps(outcome(run)), flush=True)


if __name__ == "__main__":
    main()
