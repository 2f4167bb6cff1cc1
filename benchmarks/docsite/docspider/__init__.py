"""A CrawlSpider over a local copy of a documentation site (benchmarks/frontier_crawl.py)."""
