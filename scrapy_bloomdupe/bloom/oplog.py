"""The op log: what makes a retried check-and-add answer what the first attempt did.

A reply lost after Redis ran a script would make a blind retry answer "seen" for an item the
first attempt added: a URL never crawled. So each call carries an id unique to its client, and
the script records its reply in the client's op log for the shard (``keys.op_log``); a retry is
answered from it first. Each call acks the round trips before it, which the script forgets, so
a log holds one round trip's replies (one short string, ``SET ... PX``) and expires with its
client. Both check-and-add scripts look the call up first and record their reply last:

* ``KEYS[1]`` this client's op log for the shard (a multi-shard call: its first shard's),
  ``KEYS[3]`` the shard's lock;
* ``ARGV[1]`` lock token (``''`` in atomic mode), ``ARGV[2]`` call id, ``ARGV[3]`` ack,
  ``ARGV[4]`` op log TTL (ms);
* the body sets the Lua string ``reply`` (one character an item) or returns early, writing
  nothing.

The log holds ``<ack>|<call>:<reply>|...``; a call with a new ack starts it afresh.
"""

from __future__ import annotations

#: How long an op log outlives its last write; a retry must come before this.
OP_LOG_TTL_MS = 3_600_000
