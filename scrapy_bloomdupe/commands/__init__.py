"""Scrapy commands of scrapy-bloomdupe.

``scrapy bloomdupe`` is registered with the ``scrapy.commands`` entry point
group, so it is there wherever this package is installed. A project may also
name this package in ``COMMANDS_MODULE = "scrapy_bloomdupe.commands"``: Scrapy
then finds the same command by its module's name.
"""
