"""The per-slot queue layout: crawl-wide politeness and a compact frontier (issues 38, 39).

The scripts of the layout and what they keep; :mod:`.leased` runs them for
the scheduler (tests/slotqueue.py drives them one by one). On shard ``i`` (hash
tag ``{K:i}``, :mod:`scrapy_bloomdupe.keys`):

* ``{K:i}:slot:<slot>:<priority>``: a list per download slot and priority in
  use, of compact entries (``frontier/entry.py``'s bytes, opaque here);
* ``{K:i}:slot:<slot>``: the slot's hash, only what differs from the default:
  ``flight`` (leased, by any worker; default 0), ``conc`` (its concurrency; 0 is
  no limit) and ``delay`` (ms), by default the shard's (``{K:i}:slotdefaults``,
  set by a worker's first pop; else 0), ``next`` (its next allowed start,
  kept only when a delay puts it ahead) and ``backoff`` (paused until), both ms
  on Redis's clock; and, in a slot that has a hash, ``prios`` (the priorities
  in use, highest first, "" for none). A slot with nothing but requests of
  priority 0 waiting under the default limits has **no hash** (its list says
  it waits); how many wait is the lists' lengths ;
* ``{K:i}:ready``: the slots that have requests and room, scored by when each
  may go next (``max(next, backoff)``); a slot at its concurrency is not in it
  until an ack or a reap frees room;
* ``{K:i}:slotleased:<owner>``: a list a worker of the leases it holds, in the
  order taken, each ``<pop>.<j>|<priority>|<slot>|<entry>`` (its field, as the
  worker names it, ``<owner>:<pop>.<j>``), so an ack (which names the lease as
  the list holds it: an ``LREM`` from the head) frees the right slot's room and a
  reap puts the entry back at the head of the list it came from (a dead worker's
  with one more requeue counted, NUL ``rq`` <n> NUL before it, as
  ``frontier/entry.py`` splits it: a pop hands the entry back with that prefix);
  ``{K:i}:slotleased`` counts them, and ``{K:i}:owners`` holds the heartbeats, as
  in ``frontier/queue.py``. A list of entries costs each about its bytes and 2
  more; a hash (the first version) 60-90 more, its values being over the 64
  bytes of a compact hash (``hash-max-listpack-value``).

A pop (``slot_pop.lua``) takes the slots due on Redis's clock, in the order
they became due, and from each the heads of its highest priorities, as many as
its room allows (one when it has a delay): so a slot at its limit or in its
delay never blocks the others (no head-of-line blocking), priorities are exact
within a slot, and across slots it is "due slots first, then priority". With a
horizon, it also takes the slots due within it ("claim ahead"): each such
lease carries its start (``SlotLease.start_ms``, its slot's next allowed start
or the end of its back-off; in the lease's value, ``<priority>@<start>``), and
the caller starts it no sooner. Each slot taken from gets its next allowed
start, its start plus its delay, times a factor in 0.5-1.5 with ``randomize``
(``RANDOMIZE_DOWNLOAD_DELAY``) drawn in the script from the seed the caller
passes. "Worker" politeness is the same layout
with the limits at 0 (no concurrency limit, no delay): the slots then take
turns, the one served longest ago first.

Retries: a push carries a push number (``{K:i}:slotpush:<client>`` remembers
the last), a pop a pop number (a retry returns the same leases and takes
nothing), acks, reaps and back-offs are idempotent.

Redis Cluster: every key above is in the shard's hash tag, so one Cluster slot.
The scripts declare the ready set, the lease count and the owners; they build the
slots' hashes and lists from ``prefix + name`` (undeclared keys of the same hash
slot, which Redis 7 runs but the Cluster spec asks to declare). On a cluster
a pop with declared keys (``slot_pop.lua``'s KEYS[6..]) first reads the ready set
(``ZRANGE``) and then declares the due slots' hashes (the script checks them
again on its clock); the crawl's pops do not declare (Redis 7 runs undeclared
keys of the script's own hash slot), and declaring the lists, the push's and the
ack's slots remains to build. A slot's home shard and the move of an intake's
entries there (``slot_claim.lua``): :mod:`.leased`.

Memory (Redis 7.0.15, ``MEMORY USAGE`` of every key of the layout but the push
records, divided by the requests; a 65-byte entry: a 64-byte URL and the format
byte; one priority; ``tests/test_slots.py::test_memory_per_waiting_request``
holds the rows of 100 and 1,000 slots, to a bound; a filter key of one
character here, the test's longer key adds about 30 bytes a slot, in its keys' names):

======================  =========  =====================================
waiting requests        bytes a    of which lists / slot hashes / ready
                        request
======================  =========  =====================================
10,000 over 10 slots    69         69 / 0 / 0
10,000 over 100 slots   74         73 / 0 / 0.3
10,000 over 1,000       105        94 / 0 / 12
10,000 over 10,000      377        248 / 0 / 129
======================  =========  =====================================

against **168** for today's sorted set of compact entries (docs/capacity.md),
and 69 / 75 / 117 / 512 with a hash a slot (the first version). A slot costs
about 310 bytes of its own (its list's key and quicklist node, its member of
the ready set, a skiplist past 128 slots), and a hash (about 135 more) when it
has a request in flight, a limit of its own, a start or back-off ahead or
another priority than 0: so the layout wins where slots hold more than about
3 requests each and still loses where most hold one (a broad crawl over many
hosts; docs/design-notes.md). A leased request costs about its entry and 12 bytes
(``<pop>.<j>|<priority>|<slot>|`` before it, in its worker's list; 156-171 in
the first version's hash).

Redis CPU (``INFO commandstats``, the scripts' µs divided by the requests, 10,000
over three priorities, pops of 100 each acked; a shared 2-core machine): a push,
a pop and an ack cost 0.8, 1.9 and 1.0 µs a request over 1 slot without limits;
about 7, 6 and 5 over 100 slots of concurrency 2 (no defaults set, so every slot
has a hash); about 11, 11 and 5.6 over 10,000 slots of one request, 20-40%
more than with a hash a slot (the same commands, about 3 a slot touched, and
more Lua work a slot). Today's ``pop.lua`` and ``HDEL`` ack: 2.2 and 0.1.
"""

from __future__ import annotations

import zlib

from .. import luascript

#: The layout's scripts (each headed by its KEYS, ARGV and what it returns).
PUSH_SCRIPT = luascript.read(__package__, "slot_push.lua")
POP_SCRIPT = luascript.read(__package__, "slot_pop.lua")
ACK_SCRIPT = luascript.read(__package__, "slot_ack.lua")
REAP_SCRIPT = luascript.read(__package__, "slot_reap.lua")
BACKOFF_SCRIPT = luascript.read(__package__, "slot_backoff.lua")
CLAIM_SCRIPT = luascript.read(__package__, "slot_claim.lua")
COUNT_SCRIPT = luascript.read(__package__, "slot_count.lua")


def home_shard(name: str, shards: int) -> int:
    """The shard that keeps download slot ``name`` (keys.slot_name) on a queue of
    ``shards`` shards in ``"crawl"`` mode: its lists, state, ready set and leases (crc32
    of the name, so every worker and tool places a slot alike)."""
    return zlib.crc32(name.encode()) % shards
