"""The shared request queue: scrapy-redis's priority queue, safe to retry and cluster-ready.

Scrapy-free but for scrapy-redis's base class, which (de)serializes requests.
"""

from __future__ import annotations

import secrets
from typing import Any

from scrapy_redis.queue import PriorityQueue as RedisPriorityQueue

from .. import keys

#: How long the queue's push and pop records outlive their last write; a retry
#: must come before this.
RECORD_TTL_MS = 3_600_000


class PriorityQueue(RedisPriorityQueue):  # type: ignore[misc]
    """scrapy-redis's priority queue, with a push and a pop that survive a lost
    reply, and that work on a Redis Cluster.

    scrapy-redis pops with MULTI (ZRANGE, ZREMRANGEBYRANK): if Redis runs it
    and the reply is lost (a crash, a reset connection), a retry pops the
    next request and the first is never crawled. And it pushes with a plain
    ZADD: if that reply is lost and another worker pops the request before
    the retry, the retry queues it again and it is crawled twice (seen in a
    real crawl whose Redis was killed: ``tests/faults/test_crawl_outage.py``).

    Here each is a script that records its work under this client's push or
    pop number; a retry carries the same number and is answered from the
    record instead of doing the work again. A pop's number advances once a
    pop has come back; a push's advances with every new request, and is
    kept while the same request is pushed again after a failure (a retry).
    Both records share the queue's slot (hash tag), so the scripts are
    single-slot on a cluster, where scrapy-redis's ``multi()`` is refused.
    ``SCHEDULER_QUEUE_CLASS = "scrapy_bloomdupe.frontier.queue.PriorityQueue"``
    (the scheduler's default; ``scrapy_bloomdupe.cluster.PriorityQueue`` is the
    same class under its old name).
    """

    # KEYS[1] the queue (a sorted set), KEYS[2] this client's pop record.
    # ARGV[1] this pop's number, ARGV[2] the record's TTL in ms.
    # Returns the popped request, or false when the queue is empty; a pop
    # already run (its number recorded) returns what it popped then.
    POP_SCRIPT = """
local prefix = ARGV[1] .. ':'
local done = redis.call('GET', KEYS[2])
if done and string.sub(done, 1, #prefix) == prefix then
  return string.sub(done, #prefix + 1)
end
local item = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
if not item then return false end
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, 0)
redis.call('SET', KEYS[2], prefix .. item, 'PX', ARGV[2])
return item
"""

    # KEYS[1] the queue, KEYS[2] this client's push record. ARGV[1] this push's
    # number, ARGV[2] the score, ARGV[3] the request, ARGV[4] the record's TTL
    # in ms. Returns 1 when it queued the request, 0 when this push already ran.
    PUSH_SCRIPT = """
if redis.call('GET', KEYS[2]) == ARGV[1] then return 0 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[4])
return 1
"""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        client = secrets.token_hex(6)
        self._pop_script = self.server.register_script(self.POP_SCRIPT)
        self._pop_record = keys.pop_record(self.key, client)
        self._pop_number = 1
        self._push_script = self.server.register_script(self.PUSH_SCRIPT)
        self._push_record = keys.push_record(self.key, client)
        self._push_number = 0
        self._unanswered_push: bytes | None = None

    def push(self, request: Any) -> None:
        data = self._encode_request(request)
        if data != self._unanswered_push:  # a new push, not a retry of the last
            self._push_number += 1
            self._unanswered_push = data
        self._push_script(keys=[self.key, self._push_record],
                          args=[self._push_number, -request.priority, data, RECORD_TTL_MS])
        self._unanswered_push = None

    def pop(self, timeout: int = 0) -> Any:
        item = self._pop_script(keys=[self.key, self._pop_record],
                                args=[self._pop_number, RECORD_TTL_MS])
        self._pop_number += 1  # only once the reply is in: a retry replays
        if item:
            return self._decode_request(item)
        return None

    def close(self) -> None:
        """Forget this client's records (no push or pop is under way at close)."""
        self.server.delete(self._pop_record, self._push_record)

    def clear(self) -> None:
        super().clear()
        self.close()
