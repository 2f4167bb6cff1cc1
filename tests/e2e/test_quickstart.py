"""End to end: the README's quick start, followed as a user follows it.

A project made by the installed Scrapy's ``scrapy startproject`` (its template's
settings kept: ``ROBOTSTXT_OBEY``, ``CONCURRENT_REQUESTS_PER_DOMAIN = 1``,
``DOWNLOAD_DELAY = 1``), its ``settings.py`` edited as the README's quick start
says (the Python block is read from README.md, so the test follows the doc), a
CrawlSpider of the user's over the local demo site, and the README's two
``scrapy crawl`` workers: every page fetched once.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis
from harness import zygote
from helpers import ROOT, demo_site, take_fetches, wait_workers

from scrapy_bloomdupe.testing import RedisServer

#: Few pages: the template's DOWNLOAD_DELAY = 1 and CONCURRENT_REQUESTS_PER_DOMAIN = 1 stay.
PAGES = 15
README = ROOT / "README.md"

SPIDER = '''
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule


class {name}(CrawlSpider):
    name = "{spider}"
    allowed_domains = ["127.0.0.1"]
    start_urls = ["{start}"]
    rules = (Rule(LinkExtractor(), callback="parse_item", follow=True),)

    def parse_item(self, response):
        yield {{"url": response.url}}
'''


def quick_start() -> dict[str, list[str]]:
    """The README's quick start: its code blocks by language, in order."""
    text = README.read_text()
    section = text[text.index("## Quick start"):]
    section = section[:section.index("\n## ")]
    blocks: dict[str, list[str]] = {}
    for language, body in re.findall(r"```(\w+)\n(.*?)```", section, re.S):
        blocks.setdefault(language, []).append(body)
    return blocks


def settings_lines(block: str) -> dict[str, str]:
    """``NAME = value`` lines of a settings block (comments dropped), by name."""
    found = {}
    for line in block.splitlines():
        code = line.split("  #")[0].rstrip()
        if match := re.fullmatch(r"([A-Z_]+) = (.+)", code):
            found[match[1]] = code
    return found


def edited_settings(template: str, block: str, redis_url: str) -> str:
    """``settings.py`` as the README says to edit it: the template's own ``ADDONS = {}``
    line filled in, the other lines added (``REDIS_URL`` pointing at the test's Redis)."""
    lines = settings_lines(block)
    assert template.count("\nADDONS = {}\n") == 1, "the template's ADDONS line moved"
    text = template.replace("\nADDONS = {}\n", f"\n{lines.pop('ADDONS')}\n")
    lines["REDIS_URL"] = f"REDIS_URL = {redis_url!r}"
    return text + "\n" + "\n".join(lines.values()) + "\n"


def namespace(source: str) -> dict[str, object]:
    values: dict[str, object] = {}
    exec(source, values)
    return values


@dataclass
class Crawl:
    """The quick start's crawl, run once for the module's tests."""

    codes: list[int]
    logs: list[str]
    fetches: list[int]
    workers: int


@pytest.fixture(scope="module")
def crawl(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Crawl]:
    blocks = quick_start()
    commands = "\n".join(blocks["sh"])
    project = re.search(r"scrapy startproject (\w+)", commands)
    assert project, "the quick start makes a project with scrapy startproject"
    crawls = re.findall(r"^scrapy crawl (\w+)", commands, re.M)
    assert len(crawls) == 2 and len(set(crawls)) == 1, crawls  # two workers, one spider
    (block,) = [b for b in blocks["python"] if "ADDONS" in b]
    assert {"ADDONS", "REDIS_URL", "SCHEDULER_PERSIST"} <= set(settings_lines(block))

    tmp_path = tmp_path_factory.mktemp("quickstart")
    made = subprocess.run([sys.executable, "-m", "scrapy", "startproject", project[1]],
                          cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert made.returncode == 0, made.stdout + made.stderr
    root = tmp_path / project[1]
    settings = root / project[1] / "settings.py"
    template = settings.read_text()

    # What the README warns of: an ADDONS line added above the template's is overwritten.
    wrong = settings_lines(block)["ADDONS"] + "\n" + template
    assert namespace(wrong)["ADDONS"] == {}
    settings.write_text(edited_settings(template, block, redis_server.url))
    assert namespace(settings.read_text())["ADDONS"] == {
        "scrapy_bloomdupe.addon.BloomDupeAddon": 100}

    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    # SCHEDULER_PERSIST = True on a Redis without persistence warns (rightly) at start.
    before = client.config_get("save")["save"]
    client.config_set("save", "3600 1")
    try:
        with demo_site(PAGES) as site:
            spider = crawls[0]
            (root / project[1] / "spiders" / f"{spider}.py").write_text(
                SPIDER.format(name="QuickStartSpider", spider=spider, start=site.url))
            env = {k: v for k, v in os.environ.items()
                   if k not in ("PYTHONPATH", "REDIS_URL")}
            logs = [tmp_path / f"worker-{i}.log" for i in range(len(crawls))]
            workers = [zygote.popen([sys.executable, "-m", "scrapy", "crawl", spider,
                                     "-s", f"LOG_FILE={log}"], cwd=root, env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                       for log in logs]
            codes = wait_workers(workers, timeout=150)
            yield Crawl(codes, [log.read_text() for log in logs], take_fetches(site),
                        len(crawls))
    finally:
        client.config_set("save", before)
        client.close()


def test_the_readme_s_quick_start_crawls_every_page_once(crawl: Crawl) -> None:
    assert crawl.codes == [0] * crawl.workers, "\n".join(t[-3000:] for t in crawl.logs)
    assert crawl.fetches == [1] * PAGES, crawl.fetches  # the start page too
    for text in crawl.logs:
        assert "scrapy_bloomdupe.addon.BloomDupeAddon" in text  # "Enabled addons:"
        assert "'bloomdupe/checked':" in text  # the package's stats: its filter ran
        assert "Traceback" not in text and "] ERROR:" not in text, text[-3000:]
