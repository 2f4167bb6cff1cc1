"""The package's Lua scripts, each a ``.lua`` file beside the module that calls it.

Each is a whole script headed by its ``KEYS``, ``ARGV`` and reply (shared blocks come in by
``-- #include``), so tests call it directly; callers :func:`read` it and run it by ``EVALSHA``.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

#: A line replaced by another file, whole: of the same package, or ``<folder>/<file>`` of a
#: folder of this package (e.g. the filter's scripts include ``frontier/sink.lua``).
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
