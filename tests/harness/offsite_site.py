"""A site with no robots.txt whose pages link off-site, and a real ``scrapy startproject``
project that crawls it as a user's first project would (issue 49, items 2 and 3).

* :class:`LinkSite`: ``/`` (the start page) links every page; each page ``/p/<i>.html``
  links back to ``/``, to two other pages and off-site (to ``offsite-<i % 3>.example``
  and to ``localhost``, which is this very server under another host name: a fetch of
  it would be counted). ``/robots.txt`` answers 404, as most sites do. Every GET is
  counted by path (:attr:`LinkSite.fetches`), served from a thread of the test's
  process. With ``gate_after=N``, every page asked after the first N waits for
  :attr:`LinkSite.gate` (so a crawl is still under way when a late worker joins).
* :func:`start_project`: ``scrapy startproject`` (the template of the Scrapy installed
  here, run by it), the add-on put in the template's own ``ADDONS`` line, and a
  ``CrawlSpider`` ``pages`` with ``allowed_domains = ["127.0.0.1"]`` and
  ``start_urls`` (``-a start=URL``), which Scrapy's default ``start()`` yields with
  ``dont_filter``.
* :func:`final_stats`: a worker's integer stats, from the "Dumping Scrapy stats" block
  of its log.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from harness import zygote

#: The add-on's line, as the README activates it, in place of the template's own.
ADDON_LINE = 'ADDONS = {"scrapy_bloomdupe.addon.BloomDupeAddon": 100}'
TEMPLATE_ADDONS = "ADDONS = {}"
#: Off-site hosts the pages link to (besides ``localhost``).
OFFSITE_HOSTS = 3

SPIDER = '''\
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule


class PagesSpider(CrawlSpider):
    name = "pages"
    allowed_domains = ["127.0.0.1"]
    rules = (Rule(LinkExtractor(), callback="parse_page", follow=True),)

    def __init__(self, start="", *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.start_urls = [start]

    def parse_page(self, response):
        yield {"url": response.url}
'''


class LinkSite:
    """``pages`` pages (``/`` included), each GET counted by path; ``delay`` seconds a
    page; the pages asked after the first ``gate_after`` wait for :attr:`gate`."""

    def __init__(self, pages: int, *, delay: float = 0.0, gate_after: int | None = None
                 ) -> None:
        self.pages = pages
        self.delay = delay
        self.gate_after = gate_after
        self.gate = threading.Event()
        if gate_after is None:
            self.gate.set()
        self.fetches: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.site = self  # type: ignore[attr-defined]
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/"

    @property
    def paths(self) -> list[str]:
        return ["/", *(f"/p/{i}.html" for i in range(1, self.pages))]

    def page_fetches(self) -> int:
        with self.lock:
            return sum(n for path, n in self.fetches.items() if path != "/robots.txt")

    def offsite_links(self, path: str) -> list[str]:
        """The off-site links of the page at ``path`` (none on ``/``)."""
        if path == "/":
            return []
        i = int(path.removeprefix("/p/").removesuffix(".html"))
        return [f"http://offsite-{i % OFFSITE_HOSTS}.example/",
                f"http://localhost:{self.port}/"]

    def body(self, path: str) -> bytes | None:
        if path == "/":
            links = [f"/p/{i}.html" for i in range(1, self.pages)]
        elif path in self.paths:
            i = int(path.removeprefix("/p/").removesuffix(".html"))
            others = {1 + (i % (self.pages - 1)), 1 + ((i * 7) % (self.pages - 1))} - {i}
            links = ["/", *(f"/p/{j}.html" for j in sorted(others)),
                     *self.offsite_links(path)]
        else:
            return None
        anchors = "".join(f'<a href="{link}">{link}</a>\n' for link in links)
        return f"<html><head><title>{path}</title></head><body>{anchors}</body></html>".encode()


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        site: LinkSite = self.server.site  # type: ignore[attr-defined]
        with site.lock:
            site.fetches[self.path] += 1
        body = site.body(self.path)
        if body is None:  # robots.txt too: this site has none
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if site.gate_after is not None and site.page_fetches() > site.gate_after:
            site.gate.wait(120)
        if site.delay:
            time.sleep(site.delay)
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def link_site(pages: int, *, delay: float = 0.0, gate_after: int | None = None
              ) -> Iterator[LinkSite]:
    site = LinkSite(pages, delay=delay, gate_after=gate_after)
    thread = threading.Thread(target=site.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield site
    finally:
        site.gate.set()
        site.server.shutdown()
        site.server.server_close()
        thread.join(10)


@dataclass
class Project:
    """A ``scrapy startproject`` project; ``settings`` go to every crawl with ``-s``."""

    path: Path
    settings: dict[str, str]

    def start(self, log: Path, site_url: str, **settings: str) -> Any:
        """``scrapy crawl pages -a start=SITE_URL`` in the project (a process of its own,
        stopped by its Popen), logging to ``log``."""
        command = [sys.executable, "-m", "scrapy", "crawl", "pages", "-a", f"start={site_url}"]
        for name, value in {**self.settings, **settings, "LOG_FILE": str(log)}.items():
            command += ["-s", f"{name}={value}"]
        return zygote.popen(command, cwd=self.path, env=dict(os.environ),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def start_project(parent: Path, redis_url: str, *, name: str = "offsiteproj") -> Project:
    """``scrapy startproject NAME`` in ``parent``, the add-on activated in the template's
    ``ADDONS`` line, the ``pages`` spider added. The template's ``DOWNLOAD_DELAY = 1``
    is set to 0 for the crawls (``-s``), or a few pages would take a minute."""
    subprocess.run([sys.executable, "-m", "scrapy", "startproject", name], cwd=parent,
                   check=True, capture_output=True, timeout=180)
    path = parent / name
    settings_py = path / name / "settings.py"
    text = settings_py.read_text()
    assert text.count(TEMPLATE_ADDONS) == 1, "the template's ADDONS line changed"
    settings_py.write_text(text.replace(TEMPLATE_ADDONS, ADDON_LINE))
    (path / name / "spiders" / "pages.py").write_text(SPIDER)
    return Project(path, {"REDIS_URL": redis_url, "DOWNLOAD_DELAY": "0",
                          "BLOOMDUPE_CAPACITY": "10000", "TELNETCONSOLE_ENABLED": "False"})


STAT = re.compile(r"^\s*'([^']+)': (\d+),?$")


def final_stats(log: str) -> dict[str, int]:
    """The integer stats of the "Dumping Scrapy stats" block of a worker's log."""
    _, _, block = log.rpartition("Dumping Scrapy stats")
    stats = {}
    for line in block.splitlines()[1:]:
        match = STAT.match(line.replace("{", " ").rstrip("}"))
        if match:
            stats[match.group(1)] = int(match.group(2))
        elif not line.startswith((" ", "{")):
            break
    return stats
