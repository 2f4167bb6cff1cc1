"""A directory of HTML served on 127.0.0.1, each page after a delay, counting pages.

``python -m docspider.site --root DIR [--port 0] [--delay 0.3] [--notify N]``
(cwd benchmarks/docsite). Prints ``Doc site at http://127.0.0.1:PORT/`` once it
listens, then ``reached N`` the moment the N-th page (a 200 answer) has been
sent, so that whoever started it can act on that count at once. ``/__stats``
answers ``{"pages": <200 answers so far>, "answers": <all answers>}``.
A threaded ``http.server``: one thread a connection.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Counts:
    def __init__(self, notify: int) -> None:
        self.lock = threading.Lock()
        self.pages = 0
        self.answers = 0
        self.notify = notify

    def answered(self, ok: bool) -> None:
        with self.lock:
            self.answers += 1
            if ok:
                self.pages += 1
                if self.pages == self.notify:
                    print(f"reached {self.pages}", flush=True)


class Handler(SimpleHTTPRequestHandler):
    counts: Counts
    delay: float

    def do_GET(self) -> None:
        if self.path == "/__stats":
            with self.counts.lock:
                body = json.dumps({"pages": self.counts.pages,
                                   "answers": self.counts.answers}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        time.sleep(self.delay)
        self._status = 0
        try:
            super().do_GET()
        finally:
            self.counts.answered(self._status == 200)

    def send_response(self, code: int, message: str | None = None) -> None:
        self._status = code
        super().send_response(code, message)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Server(ThreadingHTTPServer):
    daemon_threads = True
    # 4 workers of 16 requests each connect at once: more than the default backlog (5).
    request_queue_size = 256


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.3)
    parser.add_argument("--notify", type=int, default=0)
    args = parser.parse_args(argv)
    counts = Counts(args.notify)
    handler = type("DocHandler", (Handler,), {"counts": counts, "delay": args.delay})
    server = Server(("127.0.0.1", args.port), functools.partial(handler, directory=args.root))
    print(f"Doc site at http://127.0.0.1:{server.server_address[1]}/", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
