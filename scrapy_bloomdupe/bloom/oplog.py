"""The op log: what makes a retried check-and-add answer what the first attempt did.

A reply lost after Redis ran a script (timeout, reset connection) would make
a blind retry answer "seen" for an item the first attempt added, and that URL
would never be crawled. So each script call carries an id unique to its
client, and the script records its reply in the client's op log for the shard
(``keys.op_log``); a retried call is answered from that record, before
anything else is checked. Each call also says which calls have been answered
(``ack``: every round trip before this one), and the script forgets those, so
a log holds one round trip's replies at most (one short string, rewritten with
one ``SET ... PX``) and expires when a client goes away.

Both engines' check-and-add scripts (``check_add_bits.lua``,
``check_add_bf.lua``) start by looking the call up in the op log and end by
recording their reply. The protocol they share:

* ``KEYS[1]`` this client's op log for the shard (on one node, a Lua engine call
  of several shards uses its first shard's), ``KEYS[3]`` the shard's lock;
* ``ARGV[1]`` the lock token (``''`` in atomic mode), ``ARGV[2]`` this call's
  id, ``ARGV[3]`` the ack, ``ARGV[4]`` the op log's TTL in ms;
* the body sets the Lua string ``reply`` (one character an item) or returns
  early having written nothing.

The op log holds ``<ack>|<call>:<reply>|<call>:<reply>|...``: the replies of
the round trip under way (several calls when a round trip sends more than one
to the shard). A call with a new ack starts it afresh.
"""

from __future__ import annotations

#: How long an op log outlives its last write; a retry must come before this.
OP_LOG_TTL_MS = 3_600_000
