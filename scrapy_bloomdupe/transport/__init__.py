"""Talking to Redis with redis-py: building the client, round trips, outages. No Scrapy."""
