"""The parts of :class:`scrapy_bloomdupe.scheduler.Scheduler`, a module each: the request path
(:mod:`.requestpath`), Redis work (:mod:`.jobs`), leases (:mod:`.leases`, :mod:`.upkeep`), the
crawl's end (:mod:`.ending`), shared state (:mod:`.shared`), requests failed for good
(:mod:`.failed`). None imports the scheduler."""
