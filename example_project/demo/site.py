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

``--hosts H`` spreads the pages over H sites: page ``i`` lives on ``127.0.0.<1 + i % H>``
(same port; every link to another host is absolute), which Scrapy sees as H domains,
each with its own download slot. The server then also records, per host, when each
request started and how many were in flight at once, and ``--throttle N`` makes the
N-th request to the last host answer ``429`` with ``Retry-After: 2`` (the politeness
benchmark, ``benchmarks/politeness.py``).

The server counts fetches per page (by page id, whatever the spelling of the
URL) and serves them as JSON at ``GET /__stats``::

    {"pages": 3000, "fetches": [1, 1, 0, ...], "total_fetches": ...,
     "first_fetch": <unix time>, "last_fetch": <unix time>, "not_found": 0,
     "failing": [ids of the pages that answer 500],
     "hosts": {"127.0.0.1": {"starts": [<unix time>, ...], "max_in_flight": 1}, ...},
     "throttled": [host, <unix time>] or null}
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

    def render(self, page: int, base: str, bases: list[str] | None = None) -> bytes:
        """``page`` as HTML; with ``bases`` (one a host) page ``t`` lives on
        ``bases[t % len(bases)]`` and every link is absolute."""
        def href(target: int, how: int) -> str:
            if not bases:
                return spell(target, how, base)
            there = bases[target % len(bases)]
            path = spell(target, how, there)
            return path if path.startswith("http") else there + "/" + path.lstrip("./")
        anchors = "\n".join(
            f'<li><a href="{href(target, how)}">page {target}</a></li>'
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
                 seed: int = DEFAULT_SEED, *, delay: float = 0.0, failing: int = 0,
                 hosts: int = 1, throttle: int = 0, crawl_delay: float = 0.0) -> None:
        super().__init__((host, port), _Handler)
        self.site = self
        self.delay = delay
        #: robots.txt's ``Crawl-delay`` (0: none).
        self.crawl_delay = crawl_delay
        # Spread evenly, page 0 (the start page) excepted.
        self.failing = {(j + 1) * pages // (failing + 1) for j in range(min(failing, pages - 1))}
        self.graph = SiteGraph(pages, seed)
        port = self.server_address[1]
        self.base = f"http://{host}:{port}"
        #: With ``hosts`` > 1: each host's address, and a server for each but the first.
        self.hosts = [f"127.0.0.{1 + h}" for h in range(hosts)] if hosts > 1 else [host]
        bases = [f"http://{h}:{port}" for h in self.hosts] if hosts > 1 else None
        self.bodies = [self.graph.render(p, self.base, bases) for p in range(pages)]
        self.mirrors = [_Mirror(self, h, port) for h in self.hosts[1:]]
        self.starts: dict[str, list[float]] = {h: [] for h in self.hosts}
        self.in_flight = dict.fromkeys(self.hosts, 0)
        self.max_in_flight = dict.fromkeys(self.hosts, 0)
        #: The request to the last host that answers 429 (0: none), and when it did.
        self.throttle = throttle
        self.throttled: tuple[str, float] | None = None
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

    def host_of(self, page: int) -> str:
        return self.hosts[page % len(self.hosts)]

    def started(self, host: str) -> bool:
        """A request to ``host`` starts: counted; whether it is the one to throttle."""
        with self.lock:
            self.starts[host].append(time.time())
            self.in_flight[host] += 1
            self.max_in_flight[host] = max(self.max_in_flight[host], self.in_flight[host])
            if (self.throttle and host == self.hosts[-1] and self.throttled is None
                    and len(self.starts[host]) == self.throttle):
                self.throttled = (host, time.time())
                return True
            return False

    def ended(self, host: str) -> None:
        with self.lock:
            self.in_flight[host] -= 1

    def serve(self) -> None:
        """Serve on every host until shut down (the mirrors in threads of their own)."""
        for mirror in self.mirrors:
            threading.Thread(target=mirror.serve_forever, kwargs={"poll_interval": 0.2},
                             daemon=True).start()
        self.serve_forever(poll_interval=0.2)

    def stats(self) -> dict[str, object]:
        with self.lock:
            return {
                "hosts": {h: {"starts": list(self.starts[h]),
                              "max_in_flight": self.max_in_flight[h]} for h in self.hosts},
                "throttled": self.throttled,
                "pages": self.graph.pages,
                "fetches": list(self.fetches),
                "total_fetches": sum(self.fetches),
                "first_fetch": self.first_fetch,
                "last_fetch": self.last_fetch,
                "not_found": self.not_found,
                "failing": sorted(self.failing),
            }


class _Mirror(ThreadingHTTPServer):
    """The same site on another loopback host (``--hosts``)."""

    daemon_threads = True
    request_queue_size = 256

    def __init__(self, site: DemoSite, host: str, port: int) -> None:
        super().__init__((host, port), _Handler)
        self.site = site


class _Handler(BaseHTTPRequestHandler):
    server: DemoSite | _Mirror
    protocol_version = "HTTP/1.1"  # keep-alive: Scrapy reuses its connections
    disable_nagle_algorithm = True  # headers and body go out at once

    def do_GET(self) -> None:
        site = self.server.site
        if self.path == "/__stats":
            self._send(HTTPStatus.OK, json.dumps(site.stats()).encode(), "application/json")
            return
        if self.path == "/robots.txt":
            robots = "User-agent: *\nDisallow:\n"
            if site.crawl_delay:
                robots += f"Crawl-delay: {site.crawl_delay}\n"
            self._send(HTTPStatus.OK, robots.encode(), "text/plain")
            return
        page = page_of(self.path)
        host = self.server.server_address[0] if len(site.hosts) > 1 else site.hosts[0]
        if page is None or page >= site.graph.pages or (
                len(site.hosts) > 1 and site.host_of(page) != host):
            with site.lock:
                site.not_found += 1
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")
            return
        try:
            self._page(site, page, site.started(host))
        finally:
            site.ended(host)

    def _page(self, site: DemoSite, page: int, throttled: bool) -> None:
        if throttled:  # not counted as a fetch: the crawler must come back for it
            self.send_response(HTTPStatus.TOO_MANY_REQUESTS)
            self.send_header("Retry-After", "2")
            self.send_header("Content-Length", "0")
            self.end_headers()
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
    parser.add_argument("--hosts", type=int, default=1,
                        help="spread the pages over 127.0.0.1 to 127.0.0.H (1)")
    parser.add_argument("--crawl-delay", type=float, default=0.0,
                        help="robots.txt's Crawl-delay, in seconds (0: none)")
    parser.add_argument("--throttle", type=int, default=0,
                        help="the N-th request to the last host answers 429 (0: none)")
    args = parser.parse_args(argv)
    site = DemoSite(args.host, args.port, args.pages, args.seed, delay=args.delay,
                    failing=args.failing, hosts=args.hosts, throttle=args.throttle,
                    crawl_delay=args.crawl_delay)
    # run_demo.py reads this first line to learn the port.
    print(f"Demo site with {args.pages} pages at {site.url}", flush=True)
    try:
        site.serve()
    except KeyboardInterrupt:
        pass
    finally:
        site.server_close()
        for mirror in site.mirrors:
            mirror.server_close()


if __name__ == "__main__":
    main()
