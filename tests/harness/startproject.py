"""A user's first day, as issue 49 tried it: a project made by ``scrapy startproject``
(the template of the Scrapy installed here, run by it), the add-on activated in the
template's own ``ADDONS`` line, a ``CrawlSpider`` with ``allowed_domains``, and a plain
static site served as ``python -m http.server`` serves one, with **no robots.txt**
(a 404, as most sites answer): the template sets ``ROBOTSTXT_OBEY = True``, so every
worker asks for it first.

* :func:`start_project`: the project (its ``settings.py`` as the template wrote it, the
  add-on's line and ``REDIS_URL`` put in, and a spider ``docs`` that follows every
  link); :meth:`Project.crawl` and :meth:`Project.start` run ``scrapy crawl docs`` in it.
* :func:`static_site`: a directory of HTML pages served from a thread of the test's
  process (``http.server``'s own handler: no robots.txt unless one is written), with
  each path's GETs counted (:attr:`StaticSite.fetches`).
* :func:`docs_pages`: a small site like the Python docs of the issue: an index linking
  every page, pages linking each other, links to pages that are not there (404) and
  to another host (off-site).

Used by the e2e tests of issue 49 (``tests/e2e/test_first_day.py``); the start URLs,
off-site and politeness tests can use them alike.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from harness import zygote

#: The add-on's line, as the README activates it.
ADDON_LINE = 'ADDONS = {"scrapy_bloomdupe.addon.BloomDupeAddon": 100}'
#: The template's line it replaces (a line put above it would be overwritten).
TEMPLATE_ADDONS = "ADDONS = {}"

SPIDER = '''\
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule


class DocsSpider(CrawlSpider):
    """Every page of the site, each once: ``-a start=URL``."""

    name = "docs"
    allowed_domains = ["127.0.0.1"]
    rules = (Rule(LinkExtractor(), callback="parse_page", follow=True),)

    def __init__(self, start: str = "", *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.start_urls = [start]

    def parse_page(self, response):
        yield {"url": response.url}
'''


@dataclass
class Run:
    """One ``scrapy crawl`` of a :class:`Project`: its process, then its exit code."""

    process: Any
    log: Path
    output: Path
    code: int | None = None

    def wait(self, timeout: float = 120.0) -> int:
        try:
            self.code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise
        return self.code

    def text(self) -> str:
        """The log, then what the process wrote to its standard streams."""
        log = self.log.read_text(errors="replace") if self.log.exists() else ""
        return log + self.output.read_text(errors="replace")

    def lines(self, needle: str) -> list[str]:
        return [line for line in self.text().splitlines() if needle in line]


@dataclass
class Project:
    """A project made by ``scrapy startproject``: ``root`` holds ``scrapy.cfg``."""

    root: Path
    name: str
    runs: list[Run] = field(default_factory=list)

    @property
    def settings_file(self) -> Path:
        return self.root / self.name / "settings.py"

    def settings_text(self) -> str:
        return self.settings_file.read_text()

    def start(self, start_url: str, *, settings: Mapping[str, object] | None = None,
              log_name: str | None = None) -> Run:
        """``scrapy crawl docs -a start=<start_url>`` in the project, ``settings`` given
        with ``-s``; its log in the project's directory."""
        index = len(self.runs)
        log = self.root / (log_name or f"crawl-{index}.log")
        output = log.with_suffix(".out")
        command = [sys.executable, "-m", "scrapy", "crawl", "docs", "-a", f"start={start_url}",
                   "-s", f"LOG_FILE={log}", "-s", "TELNETCONSOLE_ENABLED=False"]
        for name, value in (settings or {}).items():
            command += ["-s", f"{name}={value}"]
        with output.open("wb") as out:
            process = zygote.popen(command, cwd=self.root, stdout=out,
                                   stderr=subprocess.STDOUT, env=_env())
        run = Run(process, log, output)
        self.runs.append(run)
        return run

    def crawl(self, start_url: str, *, workers: int = 1, timeout: float = 120.0,
              settings: Mapping[str, object] | None = None) -> list[Run]:
        """``workers`` crawls started together, waited for."""
        runs = [self.start(start_url, settings=settings) for _ in range(workers)]
        for run in runs:
            run.wait(timeout)
        return runs

    def scrapy(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """``scrapy ARGS`` in the project (``scrapy bloomdupe failed``...)."""
        return zygote.run([sys.executable, "-m", "scrapy", *args], cwd=self.root, env=_env(),
                          timeout=timeout)


def _env() -> dict[str, str]:
    # A user's shell: no PYTHONPATH of the tests' (the project is found by scrapy.cfg).
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def start_project(parent: Path, redis_url: str, *, name: str = "firstday",
                  settings: str = "") -> Project:
    """``scrapy startproject <name>`` in ``parent``, then what the README asks of a user:
    the template's ``ADDONS = {}`` line made the add-on's, ``REDIS_URL`` added at the
    end (with ``settings``, more lines), and the ``docs`` spider written. Everything
    else stays as the template has it (``ROBOTSTXT_OBEY = True``,
    ``CONCURRENT_REQUESTS_PER_DOMAIN = 1``, ``DOWNLOAD_DELAY = 1``)."""
    root = parent / name
    made = zygote.run([sys.executable, "-m", "scrapy", "startproject", name, str(root)],
                      cwd=parent, env=_env(), timeout=180)
    assert made.returncode == 0, made.stdout + made.stderr
    project = Project(root, name)
    text = project.settings_text()
    assert TEMPLATE_ADDONS in text.splitlines(), "Scrapy's template has no 'ADDONS = {}' line"
    text = text.replace(TEMPLATE_ADDONS, ADDON_LINE, 1)
    text += f"\nREDIS_URL = {redis_url!r}\n{settings}\n"
    project.settings_file.write_text(text)
    (root / name / "spiders" / "docs.py").write_text(SPIDER)
    return project


# -- a static site ---------------------------------------------------------------------


@dataclass
class StaticSite:
    """A directory served over HTTP; ``fetches`` counts each path's GETs (any status)."""

    root: Path
    url: str
    fetches: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, path: str) -> None:
        with self.lock:
            self.fetches[path] += 1

    def fetched(self) -> dict[str, int]:
        with self.lock:
            return dict(self.fetches)


class _Handler(SimpleHTTPRequestHandler):
    site: StaticSite

    def do_GET(self) -> None:
        self.site.count(self.path)
        super().do_GET()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def static_site(root: Path, pages: Mapping[str, str], *, robots: str | None = None
                ) -> Iterator[StaticSite]:
    """``pages`` (path -> HTML) written under ``root`` and served on a free loopback port,
    from a thread; no ``/robots.txt`` (a 404) unless ``robots`` gives its text."""
    root.mkdir(parents=True, exist_ok=True)
    for path, body in pages.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(body)
    if robots is not None:
        (root / "robots.txt").write_text(robots)
    site = StaticSite(root, "")
    handler = type("Handler", (_Handler,), {"site": site})
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(root)))
    server.daemon_threads = True
    site.url = f"http://127.0.0.1:{server.server_address[1]}/"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                              daemon=True)
    thread.start()
    try:
        yield site
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def docs_pages(count: int = 8, *, missing: tuple[str, ...] = ("changelog.html",),
               offsite: tuple[str, ...] = ("https://www.python.org/",)) -> dict[str, str]:
    """``index.html`` and ``page-<i>.html``: the index links every page, each page the
    next and the index back, the last page links ``missing`` (not there: 404s) and
    ``offsite`` (another host)."""
    names = [f"page-{i}.html" for i in range(count)]

    def html(title: str, links: list[str]) -> str:
        anchors = "\n".join(f'<a href="{href}">{href}</a>' for href in links)
        return f"<html><head><title>{title}</title></head><body>\n{anchors}\n</body></html>\n"

    pages = {"index.html": html("index", names)}
    for i, name in enumerate(names):
        links = ["index.html", names[(i + 1) % count]]
        if i == count - 1:
            links += [*missing, *offsite]
        pages[name] = html(name, links)
    return pages
