"""The package's Lua scripts, each a ``.lua`` file beside the module that calls it.

Every file is a whole script, headed by its ``KEYS``, ``ARGV`` and what it
returns, so it reads on its own and a test can call it directly
(``tests/test_scripts.py``). The module that packs a script's keys and
arguments loads it with :func:`read` and runs it with ``EVALSHA`` (loading it
after a ``NOSCRIPT``).
"""

from __future__ import annotations

from functools import cache
from importlib import resources


@cache
def read(package: str, name: str) -> str:
    """The text of ``name`` (``"pop.lua"``) in ``package`` (``"scrapy_bloomdupe.frontier"``)."""
    return resources.files(package).joinpath(name).read_text(encoding="utf-8")
