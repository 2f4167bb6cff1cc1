"""Import the fingerprints a crawl has already seen into a Bloom filter, from:

* scrapy-redis's dupefilter SET (``SCHEDULER_DUPEFILTER_KEY``): 40 lowercase hex characters,
  for a ``"scrapy-redis"`` filter; read with ``SSCAN`` so a crawl may keep writing to it.
* Scrapy's ``JOBDIR/requests.seen``: the ``request_fingerprinter``'s, for a ``"scrapy"``
  filter; binary (2-byte big-endian length + bytes) or, from older Scrapy, hex lines, told
  apart by the first byte (a hex digit, or a length's high byte: 0 under 256 bytes).

Fingerprints of the two kinds hash different things and cannot be converted: in the wrong
filter they match nothing and every page is fetched again, so a mismatch is refused
(:class:`MigrationError`) before any write. Batches go through :meth:`BloomFilter.add_many`,
the workers' race-free check-and-add, so an import may run while workers crawl.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import keys
from .bloom.filter import BloomFilter
from .exceptions import BloomDupeError
from .transport.diagnose import describe

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

    from .settings import BloomDupeConfig

#: The fingerprint mode each source's items are in.
SET_MODE = "scrapy-redis"
JOBDIR_MODE = "scrapy"
#: What a fingerprint of each mode looks like, for messages.
MODE_DESCRIPTIONS = {
    "scrapy": "Scrapy's request fingerprints (REQUEST_FINGERPRINTER_CLASS, raw bytes, "
              "as in JOBDIR/requests.seen)",
    "scrapy-redis": "scrapy-redis's fingerprints (40 hex characters, as in its dupefilter SET)",
}
DEFAULT_BATCH_SIZE = 2000
_SCRAPY_REDIS_FP = re.compile(rb"[0-9a-f]{40}")
_HEX_DIGITS = frozenset(b"0123456789abcdefABCDEF")
_READ_CHUNK = 1 << 20
#: How many SET members are looked at before importing anything.
_SAMPLE = 20


class MigrationError(BloomDupeError):
    """An import that cannot be done as asked; the message says why and what to do."""


@dataclass
class ImportCounts:
    """What an import did; ``skipped`` counts items read that were not fingerprints."""

    read: int = 0
    added: int = 0
    already_present: int = 0
    skipped: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class Source:
    """Where fingerprints come from; :meth:`batches` yields (fingerprints, skipped count)."""

    kind: str  # "set" or "jobdir"
    name: str  # the SET's key or the file's path
    mode: str  # the fingerprint mode of its items
    format: str  # for people: "scrapy-redis SET", "binary, length-prefixed", ...
    total: int | None  # items expected (an estimate for a file), None if unknown
    notes: list[str] = field(default_factory=list)

    def batches(self, size: int) -> Iterator[tuple[list[bytes], int]]:
        raise NotImplementedError

    def describe(self) -> str:
        what = f"SET {self.name!r}" if self.kind == "set" else str(self.name)
        return f"{what} ({self.format})"


class SetSource(Source):
    """scrapy-redis's dupefilter SET, read with SSCAN."""

    def __init__(self, client: Redis | RedisCluster, key: str) -> None:
        kind = client.type(key)
        kind = kind.decode() if isinstance(kind, bytes) else str(kind)
        where = describe(client)
        if kind == "none":
            raise MigrationError(
                f"There is no key {key!r} in Redis at {where}: nothing to import. scrapy-redis "
                "keeps its fingerprints in the SET named by SCHEDULER_DUPEFILTER_KEY (by default "
                "'<spider>:dupefilter'), and deletes it when a crawl closes unless "
                "SCHEDULER_PERSIST = True."
            )
        if kind != "set":
            raise MigrationError(
                f"{key!r} in Redis at {where} is a {kind}, not a SET: it is not scrapy-redis's "
                "dupefilter (that is a SET of fingerprints, by default '<spider>:dupefilter')."
            )
        total = int(client.scard(key))
        super().__init__("set", key, SET_MODE, "scrapy-redis SET", total)
        self.client = client
        sample: list[bytes] = list(_members(client.srandmember(key, _SAMPLE)))
        odd = [m for m in sample if not _SCRAPY_REDIS_FP.fullmatch(m)]
        if odd:
            raise MigrationError(
                f"SET {key!r} holds members that are not scrapy-redis fingerprints (40 lowercase "
                f"hex characters), e.g. {odd[0][:60]!r}: {len(odd)} of {len(sample)} sampled. "
                "Only scrapy-redis's dupefilter SET can be imported."
            )

    def batches(self, size: int) -> Iterator[tuple[list[bytes], int]]:
        batch: list[bytes] = []
        skipped = 0
        cursor: int = 0
        while True:
            cursor, members = self.client.sscan(self.name, cursor, count=size)
            for member in _members(members):
                if _SCRAPY_REDIS_FP.fullmatch(member):
                    batch.append(member)
                else:
                    skipped += 1
                if len(batch) + skipped >= size:
                    yield batch, skipped
                    batch, skipped = [], 0
            if int(cursor) == 0:
                break
        if batch or skipped:
            yield batch, skipped


def _members(raw: Any) -> Iterator[bytes]:
    """SET members as bytes (a client made with ``decode_responses`` gives str)."""
    for member in raw or ():
        yield member.encode() if isinstance(member, str) else bytes(member)


class JobdirSource(Source):
    """Scrapy's ``requests.seen``, binary (2-byte length + bytes) or text (hex lines)."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        if path.is_dir():
            path = path / "requests.seen"
        if not path.is_file():
            raise MigrationError(
                f"No requests.seen file at {path}. Scrapy writes JOBDIR/requests.seen when the "
                "crawl runs with JOBDIR set and Scrapy's RFPDupeFilter (the default "
                "DUPEFILTER_CLASS); give that JOBDIR, or the file itself."
            )
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(4096)
        if head and head[0] in _HEX_DIGITS:
            line = head.split(b"\n", 1)[0].strip()
            total = round(size / (len(line) + 1)) if line else None
            fmt = "text, one hex fingerprint a line (older Scrapy)"
            notes = [
                "A text requests.seen comes from an older Scrapy. Its fingerprints match "
                "this crawl's only if both use the same fingerprinting (Scrapy 2.7+ with "
                "REQUEST_FINGERPRINTER_IMPLEMENTATION = '2.7', or the same "
                "REQUEST_FINGERPRINTER_CLASS); check a URL you know was crawled with "
                "`bloomdupe check`."
            ]
            self._text = True
        else:
            length = int.from_bytes(head[:2], "big") if len(head) >= 2 else 0
            total = round(size / (2 + length)) if length else 0
            fmt = "binary, length-prefixed (current Scrapy)"
            notes = []
            self._text = False
        super().__init__("jobdir", str(path), JOBDIR_MODE, fmt, total, notes)
        self.path = path

    def batches(self, size: int) -> Iterator[tuple[list[bytes], int]]:
        items = self._text_items() if self._text else self._binary_items()
        batch: list[bytes] = []
        skipped = 0
        for item in items:
            if item is None:
                skipped += 1
            else:
                batch.append(item)
            if len(batch) + skipped >= size:
                yield batch, skipped
                batch, skipped = [], 0
        if batch or skipped:
            yield batch, skipped

    def _text_items(self) -> Iterator[bytes | None]:
        with self.path.open("rb") as f:
            for raw in f:
                line = raw.strip()
                if not line:
                    continue
                try:
                    yield bytes.fromhex(line.decode("ascii"))
                except (UnicodeDecodeError, ValueError):
                    yield None

    def _binary_items(self) -> Iterator[bytes | None]:
        """Scrapy's ``_read_fingerprints``, a chunk at a time; a record cut short at the end
        (unclean shutdown) is dropped, as Scrapy does, with a note."""
        buffer = b""
        with self.path.open("rb") as f:
            while True:
                chunk = f.read(_READ_CHUNK)
                if chunk:
                    buffer += chunk
                pos = 0
                while pos + 2 <= len(buffer):
                    size = int.from_bytes(buffer[pos:pos + 2], "big")
                    if pos + 2 + size > len(buffer):
                        break
                    yield buffer[pos + 2:pos + 2 + size]
                    pos += 2 + size
                buffer = buffer[pos:]
                if not chunk:
                    break
        if buffer:
            self.notes.append(f"The last {len(buffer)} byte(s) of {self.path} are an incomplete "
                              "record (an unclean shutdown); skipped, as Scrapy skips them.")


def open_source(client: Redis | RedisCluster, *, from_set: str | None = None,
                from_jobdir: str | Path | None = None) -> Source:
    if (from_set is None) == (from_jobdir is None):
        raise MigrationError("give exactly one source: a SET key or a JOBDIR")
    if from_set is not None:
        return SetSource(client, from_set)
    assert from_jobdir is not None
    return JobdirSource(from_jobdir)


def mode_mismatch(source: Source, filter_mode: str, *, key: str, exists: bool,
                  setting_hint: str) -> MigrationError:
    """The refusal for a source whose fingerprints are not of the filter's kind."""
    where = (f"The Bloom filter {key!r} stores {filter_mode!r} fingerprints" if exists
             else f"A new Bloom filter {key!r} would store {filter_mode!r} fingerprints "
                  f"({setting_hint})")
    fix = (f"Import into a filter with BLOOMDUPE_FINGERPRINT = {source.mode!r}, and crawl with "
           f"that setting too, so the crawl's requests are fingerprinted the same way.")
    if exists:
        fix += (" This filter's mode is fixed when it is created: use another key "
                "(BLOOMDUPE_KEY), or `bloomdupe clear` it first if it holds nothing you need.")
    return MigrationError(
        f"{where}, but {source.describe()} holds {MODE_DESCRIPTIONS[source.mode]}. They are "
        "hashes of different things and cannot be converted: imported, they would match no "
        "request of the crawl, and every page they stand for would be fetched again. " + fix
    )


def filter_exists(client: Redis | RedisCluster, key: str) -> bool:
    return bool(client.exists(keys.meta(key)))


def open_target(client: Redis | RedisCluster, key: str, config: BloomDupeConfig,
                source: Source, *, setting_hint: str) -> tuple[BloomFilter, bool]:
    """Join the filter at ``key`` or create it from ``config``: (filter, created). Refuses,
    before writing anything, a fingerprint mode that is not the source's."""
    options: dict[str, Any] = {"use_lock": config.lock, "lock_ttl": config.lock_ttl,
                               "lock_wait": config.lock_wait}
    if filter_exists(client, key):
        bloom = BloomFilter.open(client, key, None, **options)
        if bloom.fingerprint != source.mode:
            bloom.close()
            raise mode_mismatch(source, bloom.fingerprint, key=key, exists=True,
                                setting_hint=setting_hint)
        return bloom, False
    if config.fingerprint != source.mode:
        raise mode_mismatch(source, config.fingerprint, key=key, exists=False,
                            setting_hint=setting_hint)
    bloom = BloomFilter.open(client, key, config.plan, growth=config.growth,
                             fingerprint=config.fingerprint, engine=config.engine,
                             window=config.window, **options)
    return bloom, True


def import_fingerprints(bloom: BloomFilter, source: Source, *,
                        batch_size: int = DEFAULT_BATCH_SIZE,
                        progress: Callable[[int, ImportCounts], None] | None = None
                        ) -> ImportCounts:
    """Add every fingerprint of ``source`` to ``bloom``; ``progress(items_read, counts)``
    after each batch."""
    if bloom.fingerprint != source.mode:
        raise mode_mismatch(source, bloom.fingerprint, key=bloom.key, exists=True,
                            setting_hint="")
    counts = ImportCounts()
    for items, skipped in source.batches(batch_size):
        new = bloom.add_many(items) if items else []
        added = sum(new)
        counts.read += len(items) + skipped
        counts.skipped += skipped
        counts.added += added
        counts.already_present += len(items) - added
        if progress is not None:
            progress(len(items) + skipped, counts)
    return counts
