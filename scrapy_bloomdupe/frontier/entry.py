"""A queue entry: a request in as few bytes as it takes, and back.

An entry of format 1 is::

    \\x01 URL [ \\x00 CALLBACK [ \\x00 REST ] ]

the format byte, the URL, then when needed the callback's name (a spider method) and ``REST``:
a dict of every other field that differs from a request of its class made with the URL alone,
written by ``SCHEDULER_SERIALIZER``'s ``dumps`` (pickle by default), which thus still decides
how meta is written. ``REST`` names Request's own fields by one letter (:data:`SHORT`), others by
name. A serializer other than pickle gets headers and body as Latin-1 text (for ``"json"``).

Entries from before format 1 (the serializer's ``to_dict`` dict, starting with no byte below
0x20) are read as they were. Bytes 0x01-0x1f are kept for formats: an unknown one is a newer
release's (:class:`NewerFormatError`; the queue retires it). Each worker records the queue's
format at its start (:func:`claim_format`) and does not start on one it does not know.
"""

from __future__ import annotations

import pickle
import warnings
import zlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoPermissionError
from scrapy import Request
from scrapy.exceptions import ScrapyDeprecationWarning
from scrapy.http import FormRequest, JsonRequest
from scrapy.utils.request import request_from_dict
from scrapy_redis import picklecompat

from .. import keys
from ..exceptions import BloomDupeError

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster
    from scrapy import Spider

#: The newest entry format this release writes.
FORMAT = 2
#: The queue's state format, recorded (keys.queue_format) by each worker at its start so an
#: older release, which cannot read it, does not join. 3: the filter queues into the download
#: slots; a worker meeting 2 or none migrates the queue at its start (LeasedQueue.migrate).
STATE_FORMAT = 3
#: Format 1 (see the module docstring; a pickle is written without its frame); format 2: the
#: same, ``REST`` deflated (raw ``zlib``, :data:`ZDICT` preset) when shorter. Both are read.
PLAIN, DEFLATED = 1, 2
#: Format 2's preset dictionary (the entry's URL follows it, so a ``Referer`` sharing the URL's
#: start costs little): pickles and JSON of typical requests' other fields (CrawlSpider meta,
#: redirects, retries, a form request). Fixed: a change is a new format.
ZDICT = (
    b'{"m": {"depth": 2, "download_slot": "", '
    b'"retry_times": 1, "redirect_times": 1, "'
    b'redirect_ttl": 19, "redirect_urls": ["ht'
    b'tps://"], "redirect_reasons": [301]}, "p'
    b'": 1}{"m": {"rule": 0, "link_text": "", '
    b'"depth": 1}, "p": -1}\x80\x05}\x94(\x8c\x01m\x94}\x94(\x8c\x05depth'
    b'\x94K\x02\x8c\rdownload_slot\x94\x8c\x00\x94\x8c\x0bretry_times\x94K\x01\x8c\x0e'
    b'redirect_times\x94K\x01\x8c\x0credirect_ttl\x94K\x13\x8c\rredi'
    b'rect_urls\x94]\x94\x8c\x08https://\x94a\x8c\x10redirect_reaso'
    b'ns\x94]\x94M-\x01au\x8c\x01p\x94K\x01u.\x80\x05}\x94(\x8c\x01m\x94}\x94(\x8c\rdont_red'
    b'irect\x94\x88\x8c\x16handle_httpstatus_list\x94]\x94M\x94\x01a\x8c\x10'
    b'download_timeout\x94G@f\x80\x00\x00\x00\x00\x00\x8c\x05proxy\x94\x8c\x07http'
    b'://\x94\x8c\tcookiejar\x94K\x00\x8c\x04item\x94}\x94\x8c\x0bdont_filter'
    b'\x94\x88u\x8c\x01M\x94\x8c\x04POST\x94\x8c\x01h\x94}\x94(C\x0cContent-Type\x94]\x94C!'
    b'application/x-www-form-urlencoded\x94aC\x06Acc'
    b'ept\x94]\x94C\x10application/json\x94au\x8c\x01b\x94C\x00\x94\x8c\x01o\x94}\x94'
    b'\x8c\x01k\x94}\x94\x8c\x01f\x94]\x94\x8c\x01d\x94\x88\x8c\x01n\x94\x8c\x05utf-8\x94\x8c\x01_\x94\x8c$scrap'
    b'y.http.request.form.FormRequest\x94u.\x80\x05}\x94(\x8c'
    b'\x01m\x94}\x94(\x8c\x04rule\x94K\x00\x8c\tlink_text\x94\x8c\x00\x94\x8c\x05depth\x94K\x01'
    b'u\x8c\x01p\x94J\xff\xff\xff\xffu.\x80\x05}\x94(\x8c\x01e\x94\x8c\x08_errback\x94\x8c\x01h\x94}\x94C\x07'
    b'Referer\x94]\x94C\x08https://\x94as\x8c\x01m\x94}\x94(\x8c\x04rule\x94K\x00\x8c'
    b'\tlink_text\x94\x8c\nlxml.etree\x94\x8c\x15_ElementUnicod'
    b'eResult\x94\x93\x94\x8c\x01x\x94\x85\x94\x81\x94\x8c\x05depth\x94K\x01uu.'
)
#: First bytes kept for compact formats (this one and later ones).
FORMATS = range(0x01, 0x20)
SEPARATOR = b"\x00"
#: ``REST``'s key for each of Request's own fields (the callback has its own part).
SHORT = {"errback": "e", "method": "M", "headers": "h", "body": "b", "cookies": "o",
         "meta": "m", "cb_kwargs": "k", "flags": "f", "encoding": "n", "priority": "p",
         "dont_filter": "d", "callback": "c", "url": "u", "_class": "_"}
LONG = {short: name for name, short in SHORT.items()}
#: How an entry starts when its lease expired ``n`` times: NUL, ``rq``, ``n``, NUL, then
#: the entry (no format's and no serializer's output starts with a NUL and "rq").
REQUEUED = b"\x00rq"
#: Before a subclass's own attribute whose name is one of :data:`SHORT`'s keys.
ESCAPE = "."
#: Serializers whose ``loads`` is :func:`pickle.loads`: a one-frame pickle is written unframed.
PICKLES = (picklecompat, pickle)
#: A pickle's opening (PROTO 4 or 5) and FRAME opcode, and the frame's 8-byte length.
FRAMED = (b"\x80\x04\x95", b"\x80\x05\x95")
#: Classes whose request made from a URL alone has the same fields whatever the URL.
URL_FREE_DEFAULTS = (Request, FormRequest, JsonRequest)


#: The largest score the queue gives: the largest double below 2**63, so that a Redis
#: score holds it exactly and the slot scripts spell it as an integer (Lua's "%d").
SCORE_LIMIT = 2**63 - 2**10


#: An entry that cannot be decoded: (its lease field or queue member, score, member, error).
Bad = tuple[str | bytes, int, bytes, Exception]


class NewerFormatError(BloomDupeError):
    """An entry (or a queue) of a format this release does not know."""

    def __init__(self, found: int | str) -> None:
        self.found = found
        super().__init__(f"written by a newer scrapy-bloomdupe (format {found}); upgrade "
                         "every worker")


class QueueFormatError(BloomDupeError):
    """The queue in Redis is of a format this worker does not know: it does not start."""

    def __init__(self, key: str, found: int | str) -> None:
        super().__init__(f"The shared queue at {key!r} is {NewerFormatError(found)} (this "
                         f"one reads formats up to {STATE_FORMAT})")


class Codec:
    """Entries of ``spider`` 's requests, their fields written by ``serializer`` (an
    object with ``dumps`` and ``loads``, as scrapy-redis's ``SCHEDULER_SERIALIZER``)."""

    def __init__(self, serializer: Any, spider: Spider | None) -> None:
        self.serializer = serializer
        self.spider = spider
        self._defaults: dict[type[Request], dict[str, Any]] = {}
        self._unframe = serializer in PICKLES
        #: Whether headers and body go to the serializer as text (see the module docstring).
        self._text_bytes = serializer not in PICKLES

    def encode(self, request: Request) -> bytes:
        fields = request.to_dict(spider=self.spider)
        default = self._default(type(request), request.url)
        url = request.url.encode("utf-8")
        rest: dict[str, Any] = {}
        for name, value in fields.items():
            if name == "url" or (name != "_class" and name in default
                                 and _same(value, default[name])):
                continue
            if name in SHORT:
                rest[SHORT[name]] = value
            else:
                rest[ESCAPE + name if name in LONG or name.startswith(ESCAPE) else name] = value
        callback = rest.pop("c", None)
        if callback is not None and not (isinstance(callback, str) and callback
                                         and SEPARATOR not in callback.encode("utf-8")):
            rest["c"] = callback  # not a plain name: in REST, as the serializer writes it
            callback = None
        if self._text_bytes:
            if isinstance(rest.get("h"), dict):
                rest["h"] = _headers(rest["h"], _as_text)
            if isinstance(rest.get("b"), bytes):
                rest["b"] = _as_text(rest["b"])
        if SEPARATOR in url:  # never from Scrapy's own URL handling: kept in REST then
            rest["u"], url = request.url, b""
        parts = [bytes((PLAIN,)) + url]
        if callback is not None or rest:
            parts.append(b"" if callback is None else callback.encode("utf-8"))
        if rest:
            written = self.serializer.dumps(rest)
            if isinstance(written, str):
                written = written.encode("utf-8")
            written = _unframed(written) if self._unframe else written
            deflated = _deflate(written, url)
            if len(deflated) < len(written):
                parts[0] = bytes((DEFLATED,)) + url
                written = deflated
            parts.append(written)
        return SEPARATOR.join(parts)

    def decode(self, payload: bytes) -> Request:
        """The request of an entry of any format this release reads. An entry whose first byte
        is in :data:`FORMATS` but cannot be read as that format is tried as an older entry (a
        serializer's output may start with any byte)."""
        first = payload[0] if payload else -1
        if first not in FORMATS:
            return self.decode_legacy(payload)
        try:
            if first not in (PLAIN, DEFLATED):
                raise NewerFormatError(first)
            return request_from_dict(self.fields(payload), spider=self.spider)
        except Exception as error:
            try:
                return self.decode_legacy(payload)
            except Exception:  # not an older entry either: why it is not this format
                raise error from None

    def decode_replies(self, replies: Sequence[bytes], idents: Sequence[str] | None = None
                       ) -> tuple[list[tuple[str | bytes, int, Request]], list[Bad]]:
        """The scripts' ``score|member`` replies decoded each on its own (a bad one costs only
        itself): (ident, requeue count, request) for each that decodes, and the :data:`Bad`
        ones. ``idents``: their lease fields; by default each is named by its member."""
        decoded: list[tuple[str | bytes, int, Request]] = []
        bad: list[Bad] = []
        for j, reply in enumerate(replies):
            score, member = reply.split(b"|", 1)
            ident: str | bytes = idents[j] if idents is not None else member
            try:
                requeues, payload = split_requeues(member)
                decoded.append((ident, requeues, self.decode(payload)))
            except Exception as e:  # the serializer's or request_from_dict's, whatever it is
                bad.append((ident, int(score), member, e))
        return decoded, bad

    def decode_legacy(self, payload: bytes) -> Request:
        """An entry written before format 1: the serializer's ``to_dict`` dict."""
        return request_from_dict(self.serializer.loads(payload), spider=self.spider)

    def fields(self, payload: bytes) -> dict[str, Any]:
        """The ``to_dict`` fields a format-1 or 2 entry holds (its class's defaults left out)."""
        parts = payload[1:].split(SEPARATOR, 2)
        fields: dict[str, Any] = {"url": parts[0].decode("utf-8")}
        if len(parts) > 1 and parts[1]:
            fields["callback"] = parts[1].decode("utf-8")
        if len(parts) > 2:
            written = _inflate(parts[2], parts[0]) if payload[0] == DEFLATED else parts[2]
            rest = self.serializer.loads(written)
            if not isinstance(rest, dict):
                raise ValueError(f"its fields are a {type(rest).__name__}, not a dict")
            for key, value in rest.items():
                fields[LONG.get(key, key[len(ESCAPE):] if key.startswith(ESCAPE) else key)] = \
                    value
            if isinstance(fields.get("headers"), dict):
                fields["headers"] = _headers(fields["headers"], _as_bytes)
            # (bytes here: Request would encode a str body by its encoding, not Latin-1)
            if isinstance(fields.get("body"), str):
                fields["body"] = _as_bytes(fields["body"])
        return fields

    def _default(self, cls: type[Request], url: str) -> dict[str, Any]:
        """The fields of a ``cls`` made with ``url`` alone ({} if it cannot be: all are written)."""
        cached = self._defaults.get(cls)
        if cached is not None:
            return cached
        try:
            with warnings.catch_warnings():  # Scrapy 2.16-18 deprecate FormRequest: already warned
                warnings.simplefilter("ignore", ScrapyDeprecationWarning)
                default = cls(url=url).to_dict()
        except Exception:  # a user's class that needs more than a URL
            default = {}
        if cls in URL_FREE_DEFAULTS:
            self._defaults[cls] = default
        return default


def _unframed(data: bytes) -> bytes:
    """A one-frame pickle without its frame header (optional, PEP 3154); any other as it is."""
    if data[:3] in FRAMED and int.from_bytes(data[3:11], "little") == len(data) - 11:
        return data[:2] + data[11:]
    return data


def _headers(headers: dict[Any, Any], convert: Callable[[Any], Any]) -> dict[Any, Any]:
    """``headers`` (``to_dict``'s: name to list of values) with every name and value converted."""
    return {convert(name): [convert(v) for v in values] if isinstance(values, list)
            else convert(values) for name, values in headers.items()}


def _as_text(value: Any) -> Any:
    return value.decode("latin-1") if isinstance(value, bytes) else value


def _as_bytes(value: Any) -> Any:
    """A header's text back to bytes (as is if not Latin-1: Scrapy's ``Headers`` encodes it)."""
    if isinstance(value, str):
        try:
            return value.encode("latin-1")
        except UnicodeEncodeError:
            return value
    return value


def score(request: Request) -> int:
    """``request`` 's score in the queue: its priority negated (the lowest comes out first),
    held within :data:`SCORE_LIMIT` (Scrapy allows any int; Redis and the slot scripts do not).
    Beyond 2**53 the order is only rough, as a double's; the entry keeps the priority."""
    return max(-SCORE_LIMIT, min(SCORE_LIMIT, -request.priority))


def split_requeues(member: bytes) -> tuple[int, bytes]:
    """A queued member's requeue count (see :data:`REQUEUED`) and its entry."""
    if not member.startswith(REQUEUED):
        return 0, member
    stop = member.index(b"\x00", len(REQUEUED))
    return int(member[len(REQUEUED):stop]), member[stop + 1:]


def _same(value: Any, default: Any) -> bool:
    try:
        return type(value) is type(default) and bool(value == default)
    except Exception:  # a meta value whose == does not answer a bool
        return False


def _deflate(data: bytes, url: bytes) -> bytes:
    """Format 2's compression of the other fields of an entry of ``url``."""
    packer = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY,
                              ZDICT + url)
    return packer.compress(data) + packer.flush()


def _inflate(data: bytes, url: bytes) -> bytes:
    unpacker = zlib.decompressobj(-15, ZDICT + url)
    return unpacker.decompress(data) + unpacker.flush()


def peek(serializer: Any, payload: bytes) -> tuple[str, str] | None:
    """The URL and method of a format-1 or 2 entry, as far as read without the spider (method
    ``""`` when its fields cannot be read); None for another format."""
    if not payload or payload[0] not in (PLAIN, DEFLATED):
        return None
    parts = payload[1:].split(SEPARATOR, 2)
    url = parts[0].decode("utf-8", errors="replace")
    try:
        written = b"" if len(parts) < 3 else (
            _inflate(parts[2], parts[0]) if payload[0] == DEFLATED else parts[2])
        rest = serializer.loads(written) if len(parts) > 2 else {}
        method = rest.get("M", "GET")
        url = url or rest.get("u", url)
    except Exception:  # best effort: the URL alone
        return url, ""
    return str(url), method if isinstance(method, str) else ""


def found_format(client: Redis | RedisCluster, tag: str) -> int | None:
    """The queue's format record of the crawl ``tag`` (None: none, or not a number)."""
    try:
        found = client.get(keys.queue_format(tag))
    except NoPermissionError:
        return None  # the filter's start-up check names what the ACL lacks
    text = found.decode(errors="replace") if isinstance(found, bytes) else str(found or "")
    return int(text) if text.isdigit() else None


def claim_format(client: Redis | RedisCluster, tag: str, *, write: bool = True) -> bool:
    """Record that crawl ``tag``'s queue holds this release's format (at a worker's start,
    before it queues anything; ``write`` False: only look); whether it is recorded now. Raises
    :class:`QueueFormatError` when a newer release recorded one this release does not know."""
    name = keys.queue_format(tag)
    try:
        found = client.get(name)
        if found is not None:
            text = found.decode(errors="replace") if isinstance(found, bytes) else str(found)
            if not text.isdigit() or int(text) > STATE_FORMAT:
                raise QueueFormatError(tag, text)
            if int(text) == STATE_FORMAT:
                return True
        if write:
            client.set(name, STATE_FORMAT)
        return write
    except NoPermissionError as e:
        if not write:
            return False  # the filter's start-up check, next, names what the ACL lacks
        raise BloomDupeError(
            f"Redis refused reading or writing {name}, the queue's format record ({e}). "
            "Grant the crawl's user the ACL of docs/security.md.") from None
