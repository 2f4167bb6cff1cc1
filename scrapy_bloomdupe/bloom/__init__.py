"""The sharded Bloom filter in Redis, Scrapy-free. Never imports ``frontier``."""
