"""What tests, the benchmarks and the demo share to run real processes: the demo site,
``scrapy crawl`` workers, a latency proxy, the kill and operator-event campaigns."""
