"""Every Redis key this package writes, spelled once.

For a filter whose key is ``K`` (``BLOOMDUPE_KEY``), shard ``i`` and generation ``g``:

==============================  =====================================================
``K:meta``                      hash: the parameters every worker must share
``K:growlock``                  string: held while a generation is added
``K:stats``, ``K:workers``      hashes: crawl-wide counters, one line per worker
``K:live``                      sorted set: running workers, by their last write
``K:live:<worker>``             string: a running worker's figures, JSON (expires)
``{K:i}:bits[:g]``              strings: shard ``i``'s bits, generation 0 (or ``g``), Lua engine
``{K:i}:bf[:g]``                RedisBloom filters: the same, for the native engine
``{K:i}:bits:s<n>``             with a window: shard ``i`` of time slice ``n`` (expires on
                                schedule); ``:g<g>`` after it, the slice's generation ``g``
``{K:i}:bf:s<n>``               the same, for the native engine
``{K:i}:slices``                hash: with a window, the live slices and their generations
``{K:i}:forgot``                set: items ``bloomdupe forget`` re-admits, once each
``K:forgets``                   string: forget count (workers drop local caches on a change)
``{K:i}:lock``                  string: shard ``i``'s lock (lock mode)
``{K:i}:gen``                   string: generations shard ``i`` has seen in use
``{K:i}:ops:<client>``          string: a client's op log on shard ``i``
``{K:0}:probe:*``               for a moment at start: the check of the ACL
==============================  =====================================================

and for the crawl's shared request queue (the frontier), sharded like the filter, with the
per-slot layout (``frontier/slots.py``; ``<slot>`` as :func:`slot_name` writes it):

==============================  =====================================================
``{K:i}:queue``                 sorted set: requests waiting (score: -priority)
``{K:i}:leases``                hash: requests taken by a worker, until it is done
``{K:i}:owners``                sorted set: workers holding leases, by last heartbeat
``{K:i}:push:<client>``         string: a client's last unfiltered push
``{K:0}:failed``                stream: requests that failed for good
``{K:0}:format``                string: the format of the crawl's state (its entries and layout)
``{K:0}:builds``                hash: each worker's ``<version> <format>``, by owner id
``{K:i}:slot:<slot>``           hash: a slot's state that is not the default (priorities,
                                in flight, limits, next start, back-off)
``{K:i}:slot:<slot>:<p>``       list: the slot's waiting entries of priority ``p``
``{K:i}:ready``                 sorted set: slots with room, by when each may go next
``{K:i}:slotleased``            string: how many requests are taken from the slots
``{K:i}:slotleased:<owner>``    list: what a worker took from the slots, until acked
``{K:i}:slotpush:<client>``     string: a client's last push into the slots
``{K:i}:slotdefaults``          hash: the crawl's default limits of a slot
``{K:i}:slotwaiting``           string: how many requests wait in the slots' lists
``{K:i}:slotstrikes``           hash: a slot's back-offs in a row, and the last
``{K:i}:slotrobots``            hash: a slot's robots.txt ``Crawl-delay`` (ms)
==============================  =====================================================

The hash tag ``{K:i}`` keeps shard ``i`` in one Redis Cluster slot, so its check-and-add and
queue push are single-slot scripts, while shards spread over the masters.
"""

from __future__ import annotations

import re

from .exceptions import ConfigError


def validate_key(key: str) -> None:
    """Refuse a ``BLOOMDUPE_KEY`` that cannot name a filter."""
    if not isinstance(key, str) or not key:
        raise ConfigError("BLOOMDUPE_KEY", key, "must be a non-empty string")
    if "{" in key or "}" in key:
        raise ConfigError(
            "BLOOMDUPE_KEY", key, "must not contain '{' or '}': the filter adds its own hash tags"
        )


# -- a filter -----------------------------------------------------------------------

META_SUFFIX = ":meta"


def meta(key: str) -> str:
    return f"{key}{META_SUFFIX}"


def growlock(key: str) -> str:
    return f"{key}:growlock"


def stats(key: str) -> str:
    return f"{key}:stats"


def workers(key: str) -> str:
    return f"{key}:workers"


def live(key: str) -> str:
    """Running workers by last write: the index of :func:`live_worker` keys (no ``SCAN``)."""
    return f"{key}:live"


def live_worker(key: str, worker: str) -> str:
    """A running worker's figures (``bloomdupe top``); expires soon after it stops writing."""
    return f"{key}:live:{worker}"


def finished(key: str) -> str:
    """Left by a finished crawl's last worker that deleted its state (no ``SCHEDULER_PERSIST``)."""
    return f"{key}:finished"


def _shard(key: str, index: int) -> str:
    return f"{{{key}:{index}}}"


def bits(key: str, index: int, generation: int = 0) -> str:
    suffix = f":{generation}" if generation else ""
    return f"{_shard(key, index)}:bits{suffix}"


def later_bits_pattern(key: str, index: int) -> str:
    """``SCAN MATCH`` pattern of shard ``index``'s bits in generations after the first."""
    return f"{_shard(key, index)}:bits:*"


def bloom(key: str, index: int, generation: int = 0) -> str:
    """Shard ``index``'s RedisBloom filter in ``generation`` (the native engine)."""
    suffix = f":{generation}" if generation else ""
    return f"{_shard(key, index)}:bf{suffix}"


def later_bloom_pattern(key: str, index: int) -> str:
    """``SCAN MATCH`` pattern of shard ``index``'s RedisBloom filters after the first."""
    return f"{_shard(key, index)}:bf:*"


def slice_bits(key: str, index: int, slice_id: int, generation: int = 0) -> str:
    """Shard ``index``'s bits in time slice ``slice_id`` and its ``generation`` (Lua engine)."""
    return f"{_shard(key, index)}:bits:s{slice_id}" + (f":g{generation}" if generation else "")


def slice_bloom(key: str, index: int, slice_id: int, generation: int = 0) -> str:
    """Shard ``index``'s RedisBloom filter in time slice ``slice_id``, its ``generation``."""
    return f"{_shard(key, index)}:bf:s{slice_id}" + (f":g{generation}" if generation else "")


def slice_record(key: str, index: int) -> str:
    """Shard ``index``'s hash of live slices (``made``; ``<slice>``: generations;
    ``<slice>n``: items in its newest). A listed slice missing, or this, is lost state."""
    return f"{_shard(key, index)}:slices"


def forgotten(key: str, index: int) -> str:
    """Items of shard ``index`` that ``bloomdupe forget`` re-admits (answered new once)."""
    return f"{_shard(key, index)}:forgot"


def forgets(key: str) -> str:
    """Raised by ``bloomdupe forget``: workers drop their local caches when it changes."""
    return f"{key}:forgets"


def lock(key: str, index: int) -> str:
    return f"{_shard(key, index)}:lock"


def generation_marker(key: str, index: int) -> str:
    return f"{_shard(key, index)}:gen"


def op_log(key: str, index: int, client: str) -> str:
    return f"{_shard(key, index)}:ops:{client}"


def op_log_pattern(key: str, index: int) -> str:
    """``SCAN MATCH`` pattern of every client's op log on shard ``index``."""
    return f"{_shard(key, index)}:ops:*"


def probe(key: str, kind: str) -> str:
    """A key the start-up check of the ACL writes and deletes at once (one per type)."""
    return f"{_shard(key, 0)}:probe:{kind}"


def escape_pattern(text: str) -> str:
    """``text`` matched literally in a ``SCAN MATCH`` pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def shards_pattern(key: str) -> str:
    """``SCAN MATCH`` pattern of per-shard keys (too wide: narrow with :func:`belongs`)."""
    return f"{{{escape_pattern(key)}:[0-9]*}}:*"


#: The keys of a filter outside its shards (``K:<name>``), as regular expressions.
UNSHARDED = ("meta", "growlock", "stats", "workers", "finished", "live", "live:.+",
             "forgets")


def belongs(key: str, name: str) -> bool:
    """Whether ``name`` is filter ``key``'s or its queue's, by name (to clear a lost filter)."""
    return re.fullmatch(
        rf"\{{{re.escape(key)}:\d+\}}:.+|{re.escape(key)}:(?:{'|'.join(UNSHARDED)})",
        name, re.DOTALL) is not None


#: ``SCAN MATCH`` pattern of every op log of every filter.
ALL_OP_LOGS = "*:ops:*"
#: ``SCAN MATCH`` pattern of every filter's metadata.
ALL_METAS = f"*{META_SUFFIX}"


# -- the shared request queue ------------------------------------------------------


def queue(key: str, index: int) -> str:
    return f"{_shard(key, index)}:queue"


def leases(key: str, index: int) -> str:
    return f"{_shard(key, index)}:leases"


def owners(key: str, index: int) -> str:
    return f"{_shard(key, index)}:owners"


def push_record(key: str, index: int, client: str) -> str:
    return f"{_shard(key, index)}:push:{client}"


def slot_name(slot: str) -> str:
    """A slot's name in keys and leases: ``%``, ``:``, ``|`` percent-escaped, so a slot's
    hash never names another slot's list and lease fields split on ``|``."""
    return slot.replace("%", "%25").replace(":", "%3A").replace("|", "%7C")


def slot_from_name(name: str) -> str:
    """The download slot :func:`slot_name` wrote ``name`` for."""
    return name.replace("%7C", "|").replace("%3A", ":").replace("%25", "%")


def slot_prefix(key: str, index: int) -> str:
    """Prefix of shard ``index``'s slot hashes (then the name, and ``:<priority>`` for lists)."""
    return f"{_shard(key, index)}:slot:"


def slot(key: str, index: int, name: str) -> str:
    """The hash of download slot ``name`` (:func:`slot_name`) on shard ``index``."""
    return f"{slot_prefix(key, index)}{name}"


def slot_list(key: str, index: int, name: str, priority: int) -> str:
    """Slot ``name`` 's list of waiting entries of ``priority`` on shard ``index``."""
    return f"{slot(key, index, name)}:{priority}"


def ready(key: str, index: int) -> str:
    """Shard ``index``'s slots that may go, scored by when (ms, Redis's clock)."""
    return f"{_shard(key, index)}:ready"


def slot_leased(key: str, index: int) -> str:
    """Shard ``index``'s count of requests taken from its slots (leases: :func:`slot_held`)."""
    return f"{_shard(key, index)}:slotleased"


def slot_held(key: str, index: int, owner: str) -> str:
    """Worker ``owner``'s slot leases: ``<pop>.<j>|<priority>[@<start>]|<slot>|<entry>``."""
    return f"{slot_leased(key, index)}:{owner}"


def slot_defaults(key: str, index: int) -> str:
    """Shard ``index``'s default slot limits (``conc``, ``delay``); slot hashes hold the rest."""
    return f"{_shard(key, index)}:slotdefaults"


def slot_waiting(key: str, index: int) -> str:
    """Shard ``index``'s count of requests waiting in its slots' lists."""
    return f"{_shard(key, index)}:slotwaiting"


def slot_robots(key: str, index: int) -> str:
    """Shard ``index``'s delays robots.txt asked for (``Crawl-delay``): slot -> ms."""
    return f"{_shard(key, index)}:slotrobots"


def slot_strikes(key: str, index: int) -> str:
    """Shard ``index``'s back-off strikes: slot -> ``<strikes>|<last, ms>``."""
    return f"{_shard(key, index)}:slotstrikes"


def slot_push_record(key: str, index: int, client: str) -> str:
    return f"{_shard(key, index)}:slotpush:{client}"


def queue_format(key: str) -> str:
    """The format of the queue's entries (``frontier/entry.py``), in shard 0's slot."""
    return f"{_shard(key, 0)}:format"


def builds(key: str) -> str:
    """Each worker's version and state format, by owner id (shard 0's slot)."""
    return f"{_shard(key, 0)}:builds"


def failed(key: str) -> str:
    """In shard 0's slot: a requeue moves a record into shard 0's queue in one script."""
    return f"{_shard(key, 0)}:failed"


# -- every key of a crawl, for tools (``bloomdupe keys``) ---------------------------------

#: What each key of a filter ``K`` holds, by the part after ``K:`` or ``{K:i}:``.
_PLAIN = {META_SUFFIX[1:]: "the filter's parameters (hash)",
          "growlock": "held while a generation is added",
          "stats": "crawl-wide counters", "workers": "one line a worker (crawl stats)",
          "finished": "the mark of a finished crawl whose state its last worker deleted",
          "live": "running workers, by their last write (`bloomdupe top`)",
          "forgets": "how many `bloomdupe forget` runs (workers drop their local caches)"}
_SHARDED = [
    (re.compile(r"bits"), "filter shard {i}, generation 0"),
    (re.compile(r"bits:(\d+)"), "filter shard {i}, generation {g}"),
    (re.compile(r"bits:s(\d+)"), "filter shard {i}, time slice {g} (expires on schedule)"),
    (re.compile(r"bits:s(\d+):g\d+"),
     "filter shard {i}, time slice {g}, a later generation (expires on schedule)"),
    (re.compile(r"bf"), "filter shard {i}, generation 0 (RedisBloom)"),
    (re.compile(r"bf:(\d+)"), "filter shard {i}, generation {g} (RedisBloom)"),
    (re.compile(r"bf:s(\d+)"),
     "filter shard {i}, time slice {g} (RedisBloom, expires on schedule)"),
    (re.compile(r"bf:s(\d+):g\d+"),
     "filter shard {i}, time slice {g}, a later generation (RedisBloom, expires on schedule)"),
    (re.compile(r"slices"), "the live time slices of shard {i} and their generations"),
    (re.compile(r"forgot"), "items of shard {i} `bloomdupe forget` re-admits, once each"),
    (re.compile(r"lock"), "shard {i}'s lock (lock mode)"),
    (re.compile(r"gen"), "generations shard {i} has seen in use"),
    (re.compile(r"ops:.+"), "a worker's op log on shard {i} (replies of its last round trip)"),
    (re.compile(r"queue"), "request queue, shard {i} (waiting requests)"),
    (re.compile(r"leases"), "requests taken by workers and not yet done, shard {i}"),
    (re.compile(r"owners"), "workers holding leases on shard {i}, by last heartbeat"),
    (re.compile(r"push:.+"), "a worker's last unfiltered push to shard {i}"),
    (re.compile(r"slot:[^:]+"), "a download slot's state, shard {i} (per-slot layout)"),
    (re.compile(r"slot:[^:]+:-?\d+"),
     "a download slot's waiting requests of one priority, shard {i}"),
    (re.compile(r"ready"), "download slots that may go, shard {i}, by when"),
    (re.compile(r"slotleased"), "how many requests are taken from the slots, shard {i}"),
    (re.compile(r"slotleased:.+"), "a worker's requests taken from the slots of shard {i}"),
    (re.compile(r"slotpush:.+"), "a worker's last push into the slots of shard {i}"),
    (re.compile(r"slotdefaults"), "the default limits of a download slot, shard {i}"),
    (re.compile(r"slotwaiting"), "how many requests wait in the slots of shard {i}"),
    (re.compile(r"slotstrikes"), "download slots' back-offs in a row, shard {i}"),
    (re.compile(r"slotrobots"), "download slots' robots.txt Crawl-delay, shard {i}"),
    (re.compile(r"failed"), "requests that failed for good (`bloomdupe failed`)"),
    (re.compile(r"format"), "the format of the crawl's state (queue entries and layout)"),
    (re.compile(r"builds"), "each worker's version and the state format it writes"),
    (re.compile(r"probe:.+"), "the start-up check of the ACL (deleted at once)"),
]


def what_is(key: str, name: str) -> tuple[int, str] | None:
    """(shard, what it holds) if ``name`` is filter ``key``'s (shard -1: unsharded), else None."""
    prefix = f"{key}:"
    if name.startswith(prefix) and name[len(prefix):] in _PLAIN:
        return -1, _PLAIN[name[len(prefix):]]
    if name.startswith(f"{prefix}live:"):
        return -1, f"worker {name[len(prefix) + 5:]}'s own figures, while it runs"
    match = re.fullmatch(re.escape(f"{{{key}:") + r"(\d+)\}:(.+)", name, re.DOTALL)
    if match is None:
        return None
    shard, rest = int(match.group(1)), match.group(2)
    for pattern, what in _SHARDED:
        found = pattern.fullmatch(rest)
        if found is not None:
            return shard, what.format(i=shard, g=found.group(1) if found.groups() else "")
    return None
