"""The parts of :class:`scrapy_bloomdupe.scheduler.Scheduler`, one module each: where its
Redis work runs (:mod:`.jobs`), how callbacks' outputs go to Redis together
(:mod:`.outbox`), how it keeps its leases (:mod:`.upkeep`), and how it records the
requests that failed for good (:mod:`.failed`)."""
