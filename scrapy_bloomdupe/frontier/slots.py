"""The per-slot queue layout (crawl-wide politeness, a compact frontier): its scripts and
keys; :mod:`.leased` runs them (tests/slotqueue.py drives them one by one). On shard ``i``
(hash tag ``{K:i}``, :mod:`scrapy_bloomdupe.keys`):

* ``{K:i}:slot:<slot>:<priority>``: a list per slot and priority in use, of compact entries
  (``frontier/entry.py``'s bytes, opaque here);
* ``{K:i}:slot:<slot>``: the slot's hash, only what differs from the default: ``flight``
  (leased by any worker), ``conc`` (0: no limit) and ``delay`` (ms; defaults in
  ``{K:i}:slotdefaults``, set by a worker's first pop), ``next`` (next allowed start) and
  ``backoff`` (paused until), ms on Redis's clock, and ``prios`` (priorities in use, highest
  first). A slot with only priority-0 requests under the default limits has **no hash**;
* ``{K:i}:ready``: the slots with requests and room, scored by when each may go next
  (``max(next, backoff)``); a slot at its concurrency leaves it until an ack or a reap;
* ``{K:i}:slotleased:<owner>``: a worker's leases in the order taken, each
  ``<pop>.<j>|<priority>|<slot>|<entry>`` (field ``<owner>:<pop>.<j>``), so an ack (an
  ``LREM`` from the head) frees the right slot's room and a reap puts the entry back at the
  head of its list (a dead worker's with one more requeue: NUL ``rq`` <n> NUL before it);
  ``{K:i}:slotleased`` counts them, ``{K:i}:owners`` holds the heartbeats.

A pop (``slot_pop.lua``) takes the due slots in the order they became due, from each the
heads of its highest priorities, as many as its room allows (one with a delay): a slot at its
limit or in its delay never blocks the others, and priorities are exact within a slot. With a
horizon it also takes slots due within it, each such lease carrying its start
(``<priority>@<start>``; the caller starts it no sooner). A slot's next start is its start plus
its delay times a jitter drawn from the caller's seed. "Worker" politeness has no limits: slots
take turns. Pushes and pops carry numbers (a retry does nothing twice;
``{K:i}:slotpush:<client>`` keeps the last); acks, reaps and back-offs are idempotent.

Redis Cluster: every key is in the shard's hash tag; the scripts declare the ready set, lease
count and owners, and build slot keys from ``prefix + name`` (same hash slot: Redis 7 runs
them). Home shards and intake moves: :mod:`.leased`. A slot costs a few hundred bytes, so the
layout loses where most slots hold one request (its bytes and µs a request, measured:
docs/design-notes.md; tests/test_slots.py holds the bytes to a bound)."""

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
    """The shard keeping download slot ``name`` in ``"crawl"`` mode: crc32 of the name, so
    every worker and tool places a slot alike."""
    return zlib.crc32(name.encode()) % shards
