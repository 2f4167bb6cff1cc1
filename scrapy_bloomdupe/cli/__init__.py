"""``bloomdupe``: look at, check, clear and fill a scrapy-bloomdupe filter from the shell.

Two front ends share this package:

* the console script ``bloomdupe COMMAND ...`` (also ``python -m
  scrapy_bloomdupe.cli``), which needs no Scrapy project: Redis from
  ``--redis-url`` (default ``$REDIS_URL``, else ``redis://localhost:6379/0``),
  the filter's key from ``--key KEY`` or ``--spider NAME`` and
  ``--key-template`` (default ``%(spider)s:bloomdupe``);
* the Scrapy command ``scrapy bloomdupe COMMAND SPIDER ...``
  (:mod:`scrapy_bloomdupe.commands.bloomdupe`), which reads the project's
  settings (``BLOOMDUPE_KEY``, ``REDIS_URL``/``BLOOMDUPE_REDIS_URL``,
  ``REDIS_PARAMS``, ``REQUEST_FINGERPRINTER_CLASS``, the spider's
  ``custom_settings``, add-ons) and Scrapy's ``-s NAME=VALUE``.

One module per command (``info``, ``stats``, ``check``, ``clear``,
``import_``), each with a ``run(ctx, opts)``; :mod:`.context` says what they
work on, :mod:`.output` how they print, :mod:`.options` and :mod:`.run` the
command lines. Tables for people, ``--json`` for scripts. Exit status: 0 done
(``check``: every URL answered, seen or new), 1 failed (Redis unreachable, no
filter at the key, its metadata damaged or a shard missing, an import refused,
``clear`` not confirmed), 2 usage (a bad option, a URL that is not http(s)),
130 interrupted. ``info``, ``stats`` and ``check`` never write (a missing shard
is reported, not created). Passwords in Redis URLs are never printed.
"""

from __future__ import annotations

from .run import main, run_project_command

__all__ = ["main", "run_project_command"]
