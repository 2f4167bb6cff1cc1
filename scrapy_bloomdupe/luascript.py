"""The package's Lua scripts, each a ``.lua`` file beside the module that calls it.

Every file is a whole script, headed by its ``KEYS``, ``ARGV`` and what it
returns (but for a block several scripts share, which a ``-- #include`` line
names), so it reads on its own and a test can call it directly
(``tests/test_scripts.py``). The module that packs a script's keys and
arguments loads it with :func:`read` and runs it with ``EVALSHA`` (loading it
after a ``NOSCRIPT``).
"""

from __future__ import annotations

from functools import cache
from importlib import resources

#: A line that stands for another file, whole (a block several scripts share:
#: ``frontier/slot_state.lua``): of the same package, or, spelled ``<folder>/<file>``,
#: of a folder of this package (the filter's scripts queue with ``frontier/sink.lua``).
INCLUDE = "-- #include "


@cache
def read(package: str, name: str) -> str:
    """The text of ``name`` (``"pop.lua"``) in ``package`` (``"scrapy_bloomdupe.frontier"``),
    each ``-- #include <file> ...`` line replaced by that file's text."""
    if "/" in name:
        folder, name = name.split("/")
        package = f"{__package__}.{folder}"
    text = resources.files(package).joinpath(name).read_text(encoding="utf-8")
    return "\n".join(read(package, line[len(INCLUDE):].split()[0]).rstrip("\n")
                     if line.startswith(INCLUDE) else line for line in text.split("\n"))
