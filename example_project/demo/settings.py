"""Settings for the scrapy-bloomdupe demo: N workers share one crawl through Redis."""

import os

BOT_NAME = "demo"
SPIDER_MODULES = ["demo.spiders"]
NEWSPIDER_MODULE = "demo.spiders"

# --- scrapy-bloomdupe --------------------------------------------------------
# scrapy-redis's scheduler (shared request queue in Redis), with duplicates
# filtered by the sharded Redis Bloom filter instead of a SET of fingerprints.
SCHEDULER = "scrapy_bloomdupe.scheduler.Scheduler"
DUPEFILTER_CLASS = "scrapy_bloomdupe.dupefilter.RedisBloomDupeFilter"
# Checks all the links of one page in one Redis round trip instead of one each.
SPIDER_MIDDLEWARES = {"scrapy_bloomdupe.middleware.BloomDupeBatchMiddleware": 10}
# Requests that failed for good are kept in Redis (`bloomdupe failed`); with
# BLOOMDUPE_POLITENESS = "crawl", a 429 or 503 pauses its site for every worker.
DOWNLOADER_MIDDLEWARES = {"scrapy_bloomdupe.failures.FailedRequestMiddleware": 50,
                          "scrapy_bloomdupe.backoff.CrawlBackoffMiddleware": 560}
# Adds bloomdupe/* figures (fill, estimated items, ...) to the stats and logs
# them every BLOOMDUPE_LOG_INTERVAL seconds.
# (The add-on sets all four in one line: ADDONS = {"scrapy_bloomdupe.addon.BloomDupeAddon": 100}.)
EXTENSIONS = {
    "scrapy_bloomdupe.extension.BloomDupeStats": 500,
    # Each worker's own figures in Redis, for `bloomdupe top` and `bloomdupe metrics`;
    # with BLOOMDUPE_METRICS_PORT it serves them to Prometheus too.
    "scrapy_bloomdupe.workermetrics.WorkerMetrics": 510,
    # Write the final stats as JSON to DEMO_STATS_FILE, for run_demo.py.
    "demo.extensions.StatsToJson": 900,
}

# Every worker points at the same Redis.
REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
# Keep the filter and the queue when a worker closes: a worker that runs out of
# work first must not wipe them under the others. Delete the keys yourself
# (`bloomdupe clear --key site:bloomdupe`, and the "{site:bloomdupe:*}" keys) to start over.
SCHEDULER_PERSIST = True
# Items the filter is sized for at BLOOMDUPE_ERROR_RATE (default 0.001). The
# demo site has 3,000 pages: room to spare. Memory is fixed by this number.
BLOOMDUPE_CAPACITY = 10_000
BLOOMDUPE_LOG_INTERVAL = 5.0  # the extension's log line, every 5 s (default 60)

# Workers stay while the shared queue has requests or any worker holds one
# (leased); they close once it has been empty, with nothing leased, for this
# many seconds (default 3).
BLOOMDUPE_DONE_GRACE = 3.0

# --- the rest ------------------------------------------------------------------
# The site to crawl; run_demo.py starts one and passes its URL.
DEMO_SITE_URL = os.environ.get("DEMO_SITE_URL", "http://127.0.0.1:8000/")
# The demo site is local: no delay, no robots.txt. Be polite with real sites.
ROBOTSTXT_OBEY = False
CONCURRENT_REQUESTS = 16
CONCURRENT_REQUESTS_PER_DOMAIN = 16
DOWNLOAD_DELAY = 0
# No telnet console or remote-control port per worker.
TELNETCONSOLE_ENABLED = False
REMOTE_CONTROL_ENABLED = False
LOG_LEVEL = "INFO"
FEED_EXPORT_ENCODING = "utf-8"
