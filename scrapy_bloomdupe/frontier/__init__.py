"""The shared request queue (the crawl's frontier), in Redis. Never imports ``bloom``."""
