"""``bloomdupe``: look at, check, clear and fill a scrapy-bloomdupe filter from the shell.

Two front ends: the console script ``bloomdupe COMMAND ...`` (or ``python -m
scrapy_bloomdupe.cli``), needing no project (``--redis-url``, default ``$REDIS_URL``; ``--key``
or ``--spider`` with ``--key-template``), and ``scrapy bloomdupe COMMAND SPIDER ...``
(:mod:`scrapy_bloomdupe.commands.bloomdupe`), which reads the project's settings and ``-s``.

One module per command, each with ``run(ctx, opts)``; :mod:`.context` says what they work on,
:mod:`.output` how they print, :mod:`.options` and :mod:`.run` the command lines. Exit status:
0 done, 1 failed, 2 usage, 130 interrupted (docs/cli.md). ``info``, ``stats`` and ``check``
never write. Passwords in Redis URLs are never printed.
"""

from __future__ import annotations

from .run import main, run_project_command

__all__ = ["main", "run_project_command"]
