"""Settings of the doc-site crawl; the benchmark adds each contender's with ``-s``."""

BOT_NAME = "docspider"
SPIDER_MODULES = ["docspider.spiders"]
NEWSPIDER_MODULE = "docspider.spiders"

# The site the benchmark serves (docspider.site); its root URL, with a trailing "/".
DOCSITE_URL = "http://127.0.0.1:8000/"
# Scrapy's own limits otherwise (16 requests, 8 a site): a plain crawl.
ROBOTSTXT_OBEY = False
TELNETCONSOLE_ENABLED = False
LOG_LEVEL = "INFO"
