"""Scrapy commands of scrapy-bloomdupe: ``scrapy bloomdupe``, registered in the
``scrapy.commands`` entry point group (or ``COMMANDS_MODULE = "scrapy_bloomdupe.commands"``)."""
