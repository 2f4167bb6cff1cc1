"""A deterministic local website to crawl: ``python -m demo.site --port 8000 --pages 3000``.

Built for the demo, not for looks. From a seed it makes ``--pages`` pages (page
0 is ``/``, page ``i`` is ``/item?id=i&cat=i%7``), each linking to 10-20 others,
every page reachable from ``/`` (a random spanning tree plus cross links). The
links are written many ways that Scrapy's request fingerprint treats as one
URL: query parameters in either order, with or without a ``#fragment``,
relative or absolute. A page also links to the same target more than once. So
most links a spider finds are duplicates; only a shared dupefilter keeps a
multi-worker crawl at one fetch a page. 2% of the pages answer after 0.2 s;
``--delay S`` makes every page answer after S seconds (a slower site, so that
workers hold requests in flight), ``--failing N`` makes N pages (spread
evenly, page 0 excepted) always answer 500.

The server counts fetches per page (by page id, whatever the spelling of the
URL) and serves them as JSON at ``GET /__stats``::

    {"pages": 3000, "fetches": [1, 1, 0, ...], "total_fetches": ...,
     "first_fetch": <unix time>, "last_fetch": <unix time>, "not_found": 0,
     "failing": [ids of the pages that answer 500]}
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

DEFAULT_PAGES = 3000
DEFAULT_SEED = 2024
SLOW_SHARE = 0.02
SLOW_SECONDS = 0.2
CATEGORIES = 7


def page_path(page: int) -> str:
    """The canonical path of ``page``."""
    return "/" if page == 0 else f"/item?id={page}&cat={page % CATEGORIES}"


def page_of(path: str) -> int | None:
    """The page a request path (any spelling) is for, or None."""
    parts = urlsplit(path)
    if parts.path == "/" and not parts.query:
        return 0
    if parts.path != "/item":
        return None
    query = parse_qs(parts.query)
    try:
        page = int(query["id"][0])
        cat = int(query["cat"][0])
    except (KeyError, ValueError):
        return None
    if len(query) != 2 or cat != page % CATEGORIES:
        return None
    return page


class SiteGraph:
    """Which page links to which, and how each link is written. Deterministic."""

    def __init__(self, pages: int = DEFAULT_PAGES, seed: int = DEFAULT_SEED) -> None:
        if pages < 1:
            raise ValueError("a site needs at least one page")
        self.pages = pages
        rng = random.Random(seed)
        children: list[list[int]] = [[] for _ in range(pages)]
        for page in range(1, pages):  # a random tree: every page reachable from "/"
            children[rng.randrange(page)].append(page)
        self.links: list[list[tuple[int, int]]] = []  # (target, spelling) per <a>
        for page in range(pages):
            targets = list(children[page])
            want = max(rng.randint(10, 20), len(targets) + 2)
            while len(targets) < want:
                roll = rng.random()
                if roll < 0.3 and targets:
                    targets.append(rng.choice(targets))  # the same page again
                elif roll < 0.4:
                    targets.append(0)  # back to the home page
                else:
                    targets.append(rng.randrange(pages))  # a cross link
            rng.shuffle(targets)
            self.links.append([(t, rng.randrange(len(SPELLINGS))) for t in targets])
        slow_count = round(pages * SLOW_SHARE)
        self.slow = frozenset(rng.sample(range(pages), slow_count))

    def render(self, page: int, base: str) -> bytes:
        anchors = "\n".join(
            f'<li><a href="{spell(target, how, base)}">page {target}</a></li>'
            for target, how in self.links[page]
        )
        title = "Home" if page == 0 else f"Item {page}"
        return (
            f"<!doctype html>\n<html><head><title>{title}</title></head>\n"
            f"<body><h1 id=\"top\">{title}</h1>\n<ul>\n{anchors}\n</ul>\n"
            f"<p id=\"reviews\">Category {page % CATEGORIES}.</p></body></html>\n"
        ).encode()


#: Ways to write a link to a page; Scrapy's fingerprint sees them all as one URL.
SPELLINGS = ("canonical", "swapped", "fragment", "absolute", "relative")


def spell(page: int, how: int, base: str) -> str:
    name = SPELLINGS[how]
    if page == 0:
        return {"canonical": "/", "swapped": "/#top", "fragment": "/#top",
                "absolute": f"{base}/", "relative": "./"}[name]
    cat = page % CATEGORIES
    return {
        "canonical": f"/item?id={page}&cat={cat}",
        "swapped": f"/item?cat={cat}&id={page}",
        "fragment": f"/item?id={page}&cat={cat}#reviews",
        "absolute": f"{base}/item?cat={cat}&id={page}",
        "relative": f"item?id={page}&cat={cat}",
    }[name]


class DemoSite(ThreadingHTTPServer):
    """The HTTP server: pages rendered once at start, fetch counts in memory."""

    daemon_threads = True
    request_queue_size = 256  # many workers connect at once

    def __init__(self, host: str = "127.0.0.1", port: int = 0, pages: int = DEFAULT_PAGES,
                 seed: int = DEFAULT_SEED, *, delay: float = 0.0, failing: int = 0) -> None:
        super().__init__((host, port), _Handler)
        self.delay = delay
        # Spread evenly, page 0 (the start page) excepted.
        self.failing = {(j + 1) * pages // (failing + 1) for j in range(min(failing, pages - 1))}
        self.graph = SiteGraph(pages, seed)
        self.base = f"http://{host}:{self.server_address[1]}"
        self.bodies = [self.graph.render(p, self.base) for p in range(pages)]
        self.lock = threading.Lock()
        self.fetches = [0] * pages
        self.not_found = 0
        self.first_fetch: float | None = None
        self.last_fetch: float | None = None

    @property
    def url(self) -> str:
        return self.base + "/"

    def count(self, page: int) -> None:
        now = time.time()
        with self.lock:
            self.fetches[page] += 1
            if self.first_fetch is None:
                self.first_fetch = now
            self.last_fetch = now

    def stats(self) -> dict[str, object]:
        with self.lock:
            return {
                "pages": self.graph.pages,
                "fetches": list(self.fetches),
                "total_fetches": sum(self.fetches),
                "first_fetch": self.first_fetch,
                "last_fetch": self.last_fetch,
                "not_found": self.not_found,
                "failing": sorted(self.failing),
            }


class _Handler(BaseHTTPRequestHandler):
    server: DemoSite
    protocol_version = "HTTP/1.1"  # keep-alive: Scrapy reuses its connections
    disable_nagle_algorithm = True  # headers and body go out at once

    def do_GET(self) -> None:
        site = self.server
        if self.path == "/__stats":
            self._send(HTTPStatus.OK, json.dumps(site.stats()).encode(), "application/json")
            return
        if self.path == "/robots.txt":
            self._send(HTTPStatus.OK, b"User-agent: *\nDisallow:\n", "text/plain")
            return
        page = page_of(self.path)
        if page is None or page >= site.graph.pages:
            with site.lock:
                site.not_found += 1
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")
            return
        site.count(page)
        if page in site.graph.slow:
            time.sleep(SLOW_SECONDS)
        if site.delay:
            time.sleep(site.delay)
        if page in site.failing:
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, b"failing on purpose\n", "text/plain")
            return
        self._send(HTTPStatus.OK, site.bodies[page], "text/html; charset=utf-8")

    def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # thousands of requests: no access log


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--pages", type=int, default=DEFAULT_PAGES)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--delay", type=float, default=0.0,
                        help="seconds every page takes to answer (0)")
    parser.add_argument("--failing", type=int, default=0,
                        help="pages that always answer 500 (0)")
    args = parser.parse_args(argv)
    site = DemoSite(args.host, args.port, args.pages, args.seed, delay=args.delay,
                    failing=args.failing)
    # run_demo.py reads this first line to learn the port.
    print(f"Demo site with {args.pages} pages at {site.url}", flush=True)
    try:
        site.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        site.server_close()


if __name__ == "__main__":
    main()
