"""``scrapy bloomdupe COMMAND SPIDER ...``: the ``bloomdupe`` tool with a project's settings
(the key is ``BLOOMDUPE_KEY`` with the spider's name, or ``--key``; Redis, the fingerprinter and
``BLOOMDUPE_*`` come from settings, ``custom_settings``, add-ons and ``-s``). Commands and exit
status: :mod:`scrapy_bloomdupe.cli`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from ..cli.context import UsageProblem
from ..cli.options import add_project_options
from ..cli.run import run_project_command

if TYPE_CHECKING:
    import argparse


class Command(ScrapyCommand):
    # Works outside a project too (settings from -s).
    requires_project = False
    requires_crawler_process = False
    default_settings: ClassVar[dict[str, Any]] = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return ("info|stats|check|forget|clear|failed|import|keys|metrics|top SPIDER [URL ...] "
                "[options]")

    def short_desc(self) -> str:
        return "Inspect, check, clear or import into a spider's scrapy-bloomdupe filter"

    def long_desc(self) -> str:
        return (
            "info: the filter's parameters, fill, estimated items and false-positive rate, "
            "memory. stats: crawl-wide and per-worker counters. check SPIDER URL...: seen or "
            "new, adding nothing. forget SPIDER URL... [--file FILE]: re-admit URLs (the next "
            "request for each counts as new once, on every worker). clear: delete the filter "
            "(asks to type its key unless --yes). failed: requests that failed for good; "
            "--requeue fetches them again. "
            "import --from-set KEY | --from-jobdir DIR: add a scrapy-redis SET's or "
            "a JOBDIR's fingerprints (a new filter is made from the project's BLOOMDUPE_* "
            "settings). metrics --port PORT: serve the crawl's figures to Prometheus. top: a "
            "live view of the crawl (--once: one frame). The key is BLOOMDUPE_KEY with the "
            "spider's name; Redis and the fingerprinter are the project's. info, stats and "
            "check never write. --json for "
            "scripts. Exit status 0 done, 1 failed (also: the filter's metadata damaged or "
            "a shard missing), 2 bad usage."
        )

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        add_project_options(parser)

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        assert self.settings is not None
        try:
            self.exitcode = run_project_command(self.settings, args, opts)
        except UsageProblem as e:
            raise UsageError(str(e), print_help=False) from None
