"""An OTLP/HTTP receiver for the observability bench, in its own process: it reads each export's body and answers
200, decoding nothing (as cheap as a receiver can be; in production the collector is another machine).

    python -m bench.lab.otlp_sink      # prints its port; on SIGTERM, one JSON line: posts, bytes, CPU seconds

The CPU figure counts only serving (the interpreter's start is left out), so the bench can say what the sink took
from the shared cores.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a collector: the exporter reuses its connection
    posts, received = 0, 0

    def do_POST(self) -> None:
        Receiver.received += len(self.rfile.read(int(self.headers.get("content-length") or 0)))
        Receiver.posts += 1
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


class Sink:
    """The sink's process, from the bench's side: `url`, then `stop()` for its counts and CPU seconds."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.lab.otlp_sink"], stdout=subprocess.PIPE, text=True)
        self.url = f"http://127.0.0.1:{int(self.proc.stdout.readline())}/v1/traces"

    def stop(self) -> dict:
        self.proc.terminate()
        found = json.loads(self.proc.stdout.readline() or "{}")
        self.proc.wait(30)
        return found


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    started = cpu()

    def stop(*_) -> None:
        print(json.dumps({"posts": Receiver.posts, "bytes": Receiver.received, "cpu_s": cpu() - started}), flush=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    print(server.server_address[1], flush=True)
    server.serve_forever(poll_interval=60)  # stopped by SIGTERM: no need to wake twice a second


if __name__ == "__main__":
    main()
