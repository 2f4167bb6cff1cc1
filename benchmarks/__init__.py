"""Benchmarks of scrapy-bloomdupe against scrapy-redis: ``python benchmarks/run.py``."""
