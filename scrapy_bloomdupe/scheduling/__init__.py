"""The parts of :class:`scrapy_bloomdupe.scheduler.Scheduler`, one module each: the
request path's owner and how callbacks' outputs go to Redis together (:mod:`.requestpath`),
where its Redis work runs (:mod:`.jobs`), the lease's life on a worker
(:mod:`.leases`), the crawl's end as a worker sees it (:mod:`.ending`), the crawl's shared
state as a worker opens and leaves it (:mod:`.shared`), how it keeps its leases
(:mod:`.upkeep`), and how it records the requests that failed for good (:mod:`.failed`).
None imports the scheduler."""
