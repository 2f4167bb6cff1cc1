"""Compact queue entries (frontier/entry.py): every request comes back equal, a URL alone
costs the URL and a byte, today's pickled entries are still read, an entry or a queue
of a newer format is retired or refused, and a user's SCHEDULER_SERIALIZER (JSON)
writes the fields through push, pop and lease on a real Redis."""

from __future__ import annotations

import datetime
import decimal
import json
import pickle
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from helpers import crawler_for, waiting_entries
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from scrapy import Request, Spider
from scrapy.http import FormRequest, JsonRequest
from scrapy.settings import Settings
from scrapy_redis import picklecompat

from scrapy_bloomdupe import keys
from scrapy_bloomdupe.exceptions import BuildError
from scrapy_bloomdupe.frontier import entry, failed, undecodable
from scrapy_bloomdupe.frontier.entry import Codec, NewerFormatError
from scrapy_bloomdupe.frontier.leased import LeasedQueue
from scrapy_bloomdupe.frontier.politeness import OneSlot, SlotPolicy
from scrapy_bloomdupe.frontier.queue import PriorityQueue
from scrapy_bloomdupe.scheduler import Scheduler

TAG = "entry:bloomdupe"


class EntrySpider(Spider):
    name = "entry"

    def parse_item(self, response: Any) -> None:
        pass

    def parse_page(self, response: Any) -> None:
        pass

    def failed(self, failure: Any) -> None:
        pass


class NoteRequest(Request):
    """A user's subclass with an attribute of its own."""

    attributes = (*Request.attributes, "note")

    def __init__(self, *args: Any, note: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.note = note


class HostRequest(Request):
    """A user's subclass whose default meta depends on its URL."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.meta.setdefault("host", urlsplit(self.url).netloc)


class Opaque:
    """A picklable value of a user's class."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Opaque) and other.value == self.value

    __hash__ = None  # type: ignore[assignment]


SPIDER = EntrySpider()
#: Scrapy 2.16-2.18 deprecate FormRequest (for the form2request library); still queued.
FORM_DEPRECATED = pytest.mark.filterwarnings(
    "ignore:scrapy.http.FormRequest is deprecated:scrapy.exceptions.ScrapyDeprecationWarning")
text = st.text(max_size=12)
ascii_text = st.text(st.characters(max_codepoint=127), max_size=12)
scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text
           | st.binary(max_size=12) | st.datetimes() | st.decimals(allow_nan=False)
           | st.builds(Opaque, st.integers()) | st.complex_numbers(allow_nan=False))
values = st.recursive(scalars, lambda inner: (
    st.lists(inner, max_size=3) | st.tuples(inner, inner)
    | st.dictionaries(text, inner, max_size=3) | st.frozensets(st.integers(), max_size=3)),
    max_leaves=8)
urls = st.builds(lambda host, path, query: f"https://{host}.example/{path}{query}",
                 st.from_regex(r"[a-z0-9]{1,10}", fullmatch=True), ascii_text,
                 st.sampled_from(["", "?a=1", "?q=caf\u00e9&b=%20", "#frag"]))
callbacks = st.sampled_from([None, SPIDER.parse_item, SPIDER.parse_page])
header_names = st.from_regex(r"X-[A-Za-z0-9-]{1,8}", fullmatch=True)
common = {
    "callback": callbacks, "errback": st.sampled_from([None, SPIDER.failed]),
    "headers": st.dictionaries(header_names, st.from_regex(r"[ -~]{0,10}", fullmatch=True),
                               max_size=3),
    "cookies": st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True),
                               st.from_regex(r"[a-z0-9]{0,6}", fullmatch=True), max_size=2)
    | st.lists(st.fixed_dictionaries({"name": st.just("n"), "value": st.just("v"),
                                      "domain": st.just("a.example")}), max_size=1),
    "meta": st.dictionaries(text, values, max_size=3),
    "cb_kwargs": st.dictionaries(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), values,
                                 max_size=3),
    "flags": st.lists(text, max_size=2),
    "encoding": st.sampled_from(["utf-8", "latin-1", "cp1252"]),
    "priority": st.integers(min_value=-2**31, max_value=2**31),
    "dont_filter": st.booleans(),
}


def some(**strategies: Any) -> Any:
    """Keyword arguments: each of ``strategies`` present or left to its default."""
    return st.fixed_dictionaries({}, optional=strategies)


requests = st.one_of(
    st.builds(lambda url, kw: Request(url, **kw), urls, some(
        **common, method=st.sampled_from(["GET", "POST", "PUT", "HEAD"]),
        body=st.binary(max_size=40))),
    st.builds(lambda url, kw: FormRequest(url, **kw), urls, some(
        # (the form's values in any encoding the request may have)
        **common, formdata=st.dictionaries(ascii_text, ascii_text, max_size=3),
        method=st.sampled_from(["GET", "POST"]))),
    st.builds(lambda url, kw: JsonRequest(url, **kw), urls, some(
        **common, data=st.dictionaries(text, st.integers() | text, max_size=3),
        dumps_kwargs=st.sampled_from([{}, {"indent": 1}, {"sort_keys": False}]))),
    st.builds(lambda url, kw: NoteRequest(url, **kw), urls, some(**common, note=values)),
    st.builds(lambda url, kw: HostRequest(url, **kw), urls, some(**common)),
)


def same(a: Request, b: Request) -> bool:
    return type(a) is type(b) and a.to_dict(spider=SPIDER) == b.to_dict(spider=SPIDER)


@FORM_DEPRECATED
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests)
def test_every_request_comes_back_equal(request: Request) -> None:
    codec = Codec(picklecompat, SPIDER)
    payload = codec.encode(request)
    assert payload[0] in (entry.PLAIN, entry.DEFLATED)
    assert same(codec.decode(payload), request)
    # Never bigger than today's entry (the pickled to_dict dict) by more than the format
    # byte and the two separators.
    assert len(payload) <= len(pickle.dumps(request.to_dict(spider=SPIDER), -1)) + 3
    # And today's entry of the same request is still read.
    assert same(codec.decode(pickle.dumps(request.to_dict(spider=SPIDER), -1)), request)


#: JSON's values (``SCHEDULER_SERIALIZER = "json"``: what it writes and reads back as
#: they were; a tuple comes back a list, a set or bytes cannot be written).
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8)
json_common = {
    **common, "meta": st.dictionaries(text, json_values, max_size=3),
    "cb_kwargs": st.dictionaries(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), json_values,
                                 max_size=3),
    "headers": st.dictionaries(header_names, st.binary(max_size=10) | text, max_size=3)}


def made(cls: type[Request]) -> Any:
    """``cls(url, **kwargs)``; an example Scrapy refuses to make (text its encoding
    cannot write) is not one."""
    def make(url: str, kwargs: dict[str, Any]) -> Request:
        try:
            return cls(url, **kwargs)
        except UnicodeError:
            assume(False)
            raise
    return make


json_requests = st.one_of(
    st.builds(made(Request), urls, some(
        **json_common, method=st.sampled_from(["GET", "POST", "PUT"]),
        body=st.binary(max_size=40) | text)),
    st.builds(made(FormRequest), urls, some(
        **json_common, formdata=st.dictionaries(text, text, max_size=3),
        method=st.sampled_from(["GET", "POST"]))),
    st.builds(made(JsonRequest), urls, some(
        **json_common, data=st.dictionaries(text, json_values, max_size=3),
        dumps_kwargs=st.sampled_from([{}, {"indent": 1}, {"ensure_ascii": False}]))),
    st.builds(made(NoteRequest), urls, some(**json_common, note=json_values)),
    st.builds(made(HostRequest), urls, some(**json_common)),
)


@FORM_DEPRECATED
@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(json_requests)
def test_every_request_of_json_values_comes_back_equal_with_json(request: Request) -> None:
    """SCHEDULER_SERIALIZER = "json": any request whose meta, cb_kwargs and own
    attributes are JSON's values comes back equal (its headers and body, bytes, were
    lost to the serializer: dropped as unserializable)."""
    codec = Codec(json, SPIDER)
    assert same(codec.decode(codec.encode(request)), request)


@given(urls)
def test_a_url_alone_costs_the_url_and_a_byte(url: str) -> None:
    request = Request(url)
    payload = Codec(picklecompat, SPIDER).encode(request)
    assert payload == b"\x01" + request.url.encode()
    with_callback = Codec(picklecompat, SPIDER).encode(Request(url, callback=SPIDER.parse_item))
    assert with_callback == b"\x01" + request.url.encode() + b"\x00parse_item"


def test_a_subclass_attribute_named_like_a_short_key_is_kept_apart() -> None:
    class Odd(Request):
        attributes = (*Request.attributes, "m")

        def __init__(self, *args: Any, m: Any = None, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.m = m

    globals()["Odd"] = Odd  # request_from_dict loads the class by its path
    Odd.__qualname__ = "Odd"
    try:
        request = Odd("https://a.example/", m=3, meta={"x": 1})
        codec = Codec(picklecompat, SPIDER)
        back = codec.decode(codec.encode(request))
        assert type(back) is Odd and back.m == 3 and back.meta == {"x": 1}
    finally:
        del globals()["Odd"]


def test_an_entry_of_a_newer_format_says_so() -> None:
    codec = Codec(picklecompat, SPIDER)
    with pytest.raises(NewerFormatError, match=r"written by a newer scrapy-bloomdupe "
                                               r"\(format 3\); upgrade every worker"):
        codec.decode(b"\x03https://a.example/\x00whatever")
    # An older entry that happens to start with a byte kept for formats is read as one.
    odd = OddFirstByte()
    assert Codec(odd, SPIDER).decode(odd.dumps(Request("https://b.example/").to_dict())
                                     ).url == "https://b.example/"


class OddFirstByte:
    """A user's serializer whose output starts with a byte below 0x20 (as BSON's length
    does)."""

    @staticmethod
    def dumps(value: Any) -> bytes:
        return b"\x05" + pickle.dumps(value)

    @staticmethod
    def loads(data: bytes) -> Any:
        if not data.startswith(b"\x05"):
            raise ValueError("not ours")
        return pickle.loads(data[1:])


def test_the_record_of_an_undecodable_compact_entry_names_its_url() -> None:
    codec = Codec(picklecompat, SPIDER)
    payload = codec.encode(Request("https://a.example/p?x=1", method="PUT", body=b"b"))
    assert undecodable.readable(picklecompat, payload) == ("https://a.example/p?x=1", "PUT")
    assert undecodable.readable(picklecompat, b"\x01https://a.example/q\x00gone") == (
        "https://a.example/q", "GET")


# -- through the queue, on a real Redis --------------------------------------------------


def queue(client: redis.Redis, serializer: Any = None) -> PriorityQueue:
    return PriorityQueue(client, SPIDER, "entry:requests", serializer, tag=TAG)


@FORM_DEPRECATED
def test_entries_written_by_todays_release_are_read(client: redis.Redis) -> None:
    """Today's entries, pickled to_dict dicts, waiting in the queue, one of them with a
    requeue count: popped, leased and reaped as before."""
    old = [Request("https://old.example/1", callback=SPIDER.parse_item, meta={"depth": 2},
                   priority=3),
           FormRequest("https://old.example/2", formdata={"a": "b"}),
           Request("https://old.example/3", errback=SPIDER.failed)]
    members = [pickle.dumps(r.to_dict(spider=SPIDER), -1) for r in old]
    members[2] = entry.REQUEUED + b"2\x00" + members[2]
    client.zadd(keys.queue(TAG, 0), {m: -r.priority for m, r in zip(members, old,
                                                                       strict=True)})
    q = queue(client)
    leases = sorted(q.pop_leases(10), key=lambda lease: lease.request.url)
    assert all(same(lease.request, r) for lease, r in zip(leases, old, strict=True))
    assert [lease.requeues for lease in leases] == [0, 0, 2]
    # Given back (a reap of its own), each goes back as it was, and is read again.
    assert len(q.reap(release_own=True)) == 0
    assert sorted(lease.request.url for lease in q.pop_leases(10)) == [r.url for r in old]


@pytest.mark.parametrize("layout", ["sorted set", "worker", "crawl"])
def test_any_priority_is_queued_in_order_and_comes_back_as_it_was(
        client: redis.Redis, layout: str) -> None:
    """Scrapy allows any int as a priority; a Redis score is a double, and the slot
    scripts spell a priority as Lua's "%d". A priority beyond a double's range (10**400)
    made Redis refuse the whole push (the worker stopped with exit 1, and the request
    was in the filter, never queued); one of 2**63 or more came out last from the
    download slots (BLOOMDUPE_POLITENESS "worker", the default). Scores are held
    within 2**63; the entry keeps the priority."""
    # One score each end (held within 2**63): their order among them is the entries' in a
    # sorted set, the pushes' in a slot's list.
    top, bottom = [10**400, 2**70, 2**63], [-2**63, -10**400]
    priorities = [*top, 2**62, 5, 0, -1, -2**62, *bottom]
    sent = [Request(f"https://p.example/{i}", priority=p) for i, p in enumerate(priorities)]
    q: Any = queue(client) if layout == "sorted set" else LeasedQueue(
        client, SPIDER, "entry:requests", tag=TAG, lease_timeout=5.0,
        policy=OneSlot() if layout == "worker" else SlotPolicy(
            Settings({"CONCURRENT_REQUESTS_PER_DOMAIN": 0, "DOWNLOAD_DELAY": 0}), None))
    q.push_many(sent[::-1])
    got = [lease.request for lease in q.pop_leases(20)]
    assert {r.url for r in got[:len(top)]} == {r.url for r in sent[:len(top)]}
    middle = slice(len(top), -len(bottom))
    assert [r.url for r in got[middle]] == [r.url for r in sent[middle]]
    assert {r.url for r in got[-len(bottom):]} == {r.url for r in sent[-len(bottom):]}
    assert sorted(r.priority for r in got) == sorted(priorities)


def test_an_entry_of_a_newer_format_is_retired_never_looped(client: redis.Redis) -> None:
    q = queue(client)
    q.push(Request("https://a.example/ok"))
    newer = b"\x07https://a.example/newer\x00\x00future fields"
    client.zadd(keys.queue(TAG, 0), {newer: 0})
    leases = q.pop_leases(10)
    assert [lease.request.url for lease in leases] == ["https://a.example/ok"]
    retired = q.take_retired()
    assert [r.url for r in retired] == ["https://a.example/newer"]
    assert "written by a newer scrapy-bloomdupe (format 7); upgrade every worker" in \
        retired[0].reason
    [record] = failed.read(client, TAG)
    assert record.url == "https://a.example/newer" and "format 7" in record.reason
    assert q.status() == (0, 1)  # out of the queue and the leases: nothing comes back
    q.ack(leases)
    q.send_acks()
    assert q.status() == (0, 0)


def test_a_users_serializer_writes_the_fields(redis_url: str) -> None:
    """SCHEDULER_SERIALIZER = "json" (the standard library's module: loads and dumps):
    pushed, popped and leased through the scheduler; the entry's fields are JSON."""
    crawler = crawler_for(redis_url, EntrySpider, SCHEDULER_SERIALIZER="json",
                          BLOOMDUPE_KEY=TAG, SCHEDULER_PERSIST=False)
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    try:
        spider = crawler.spider
        sent = [Request("https://json.example/1", callback=spider.parse_item,
                        meta={"depth": 1, "tags": ["a", "b"], "score": 0.5}, priority=2),
                Request("https://json.example/2", cb_kwargs={"page": 2}, dont_filter=True),
                Request("https://json.example/3")]
        assert all(scheduler.enqueue_request(r) for r in sent)
        client = redis.Redis.from_url(redis_url)
        [first] = [m for m in waiting_entries(client, TAG)
                   if m[1:].startswith(b"https://json.example/1\x00parse_item\x00")]
        written = first.split(b"\x00", 2)[2]
        url = first[1:].split(b"\x00", 1)[0]
        fields = json.loads(entry._inflate(written, url) if first[0] == entry.DEFLATED
                            else written)
        assert fields["p"] == 2 and fields["m"]["tags"] == ["a", "b"], fields
        queue_ = scheduler.queue
        leases = queue_.pop_leases(10)
        assert sorted(lease.request.url for lease in leases) == [r.url for r in sent]
        by_url = {lease.request.url: lease.request for lease in leases}
        for request in sent:
            back = by_url[request.url]
            assert back.to_dict(spider=spider) == request.to_dict(spider=spider)
        assert queue_.status() == (0, 3)
        queue_.ack(leases)
        queue_.send_acks()
        assert queue_.status() == (0, 0)
    finally:
        scheduler.close("finished")


def test_json_writes_the_headers_as_text_and_reads_them_back_as_bytes() -> None:
    """SCHEDULER_SERIALIZER = "json" and a request with headers (Scrapy's RefererMiddleware
    gives every followed link a ``Referer``): JSON cannot write bytes, so the headers are
    written as Latin-1 text, any byte kept, and come back as the request's bytes. (Every
    such request was dropped as unserializable: a JSON crawl fetched its start page.)"""
    codec = Codec(json, SPIDER)
    sent = Request("https://json.example/2", callback=SPIDER.parse_item,
                   headers={"Referer": "https://json.example/", "X-Raw": b"\xff\x00caf\xc3\xa9",
                            "X-Two": ["a", "b"]})
    payload = codec.encode(sent)
    fields = json.loads(entry._inflate(payload.split(b"\x00", 2)[2], b"https://json.example/2")
                        if payload[0] == entry.DEFLATED else payload.split(b"\x00", 2)[2])
    assert fields["h"]["Referer"] == ["https://json.example/"], fields
    back = codec.decode(payload)
    assert same(back, sent)
    assert back.headers.getlist("X-Raw") == [b"\xff\x00caf\xc3\xa9"]
    assert back.headers.getlist("X-Two") == [b"a", b"b"]
    # Pickle's entries keep the bytes as they were.
    pickled = Codec(picklecompat, SPIDER).encode(sent)
    assert same(Codec(picklecompat, SPIDER).decode(pickled), sent)


@FORM_DEPRECATED
@pytest.mark.parametrize("make", [
    lambda: FormRequest("https://json.example/f", formdata={"q": "caf\u00e9", "n": "1"}),
    lambda: FormRequest("https://json.example/f", formdata={"q": "\u043f"}, encoding="cp1251"),
    lambda: JsonRequest("https://json.example/j", data={"a": 1, "b": "\u65e5"},
                        dumps_kwargs={"sort_keys": True}),
    lambda: Request("https://json.example/b", method="POST", body=b"\x00\xff\x80raw"),
    lambda: Request("https://json.example/l", method="PUT", body="caf\u00e9",
                    encoding="latin-1", headers={"X-A": ["1", "2"]}),
], ids=["form-post", "form-cp1251", "json-request", "binary-body", "latin-1-body"])
def test_json_writes_the_body_as_text_and_reads_it_back_as_bytes(make: Any) -> None:
    """SCHEDULER_SERIALIZER = "json" and a request with a body (a form's POST, every
    JsonRequest with data): the body is written as Latin-1 text, any byte kept, and comes
    back as the request's bytes, not re-encoded by its encoding. (Each was dropped as
    unserializable: bytes are not JSON.)"""
    sent = make()
    codec = Codec(json, SPIDER)
    back = codec.decode(codec.encode(sent))
    assert same(back, sent) and back.body == sent.body


# -- the queue's format in Redis ---------------------------------------------------------


def test_a_worker_records_the_format_and_refuses_a_newer_one(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    crawler = crawler_for(redis_url, EntrySpider, BLOOMDUPE_KEY=TAG)
    Scheduler.from_crawler(crawler)
    assert client.get(keys.queue_format(TAG)) == str(entry.STATE_FORMAT).encode()
    newer = entry.STATE_FORMAT + 1
    client.set(keys.queue_format(TAG), newer)
    with pytest.raises(BuildError, match=rf"holds state of format {newer}, written "
                       r"by a newer scrapy-bloomdupe; .*: upgrade this worker to a release "
                       rf"that reads format {newer}$"):
        Scheduler.from_crawler(crawler_for(redis_url, EntrySpider, BLOOMDUPE_KEY=TAG))
    # An older format (today's pickled entries: none recorded) is taken over.
    client.delete(keys.queue_format(TAG))
    Scheduler.from_crawler(crawler_for(redis_url, EntrySpider, BLOOMDUPE_KEY=TAG))
    assert client.get(keys.queue_format(TAG)) == str(entry.STATE_FORMAT).encode()


def test_dates_and_decimals_in_meta_survive() -> None:
    meta = {"when": datetime.datetime(2026, 11, 27, 10, 0), "price": decimal.Decimal("1.10")}
    codec = Codec(picklecompat, SPIDER)
    assert codec.decode(codec.encode(Request("https://a.example/", meta=meta))).meta == meta


@pytest.mark.parametrize("serializer", [picklecompat, pickle])
@pytest.mark.parametrize("size", [10, 200_000])
def test_a_pickle_is_written_without_its_frame_header(serializer: Any, size: int) -> None:
    """A one-frame pickle loses its 9 header bytes; a pickle of several frames (a large
    meta) is written as it is; both read back."""
    request = Request("https://a.example/", meta={"blob": b"x" * size})
    codec = Codec(serializer, SPIDER)
    payload = codec.encode(request)
    rest = payload.split(b"\x00", 2)[2]
    if payload[0] == entry.DEFLATED:  # (format 2: deflated, as the blob compresses)
        rest = entry._inflate(rest, payload[1:].split(b"\x00", 1)[0])
    assert rest[:1] == b"\x80" and (rest[2:3] == b"\x95") == (size > 65_536)
    assert same(codec.decode(payload), request)


def test_a_failed_request_is_recorded_compact_and_requeued(client: redis.Redis) -> None:
    """The failed record keeps the compact entry; `bloomdupe failed --requeue` (its
    script) puts it back, and a pop reads it."""
    q = queue(client)
    request = Request("https://failed.example/1", callback=SPIDER.parse_item,
                      meta={"depth": 3}, priority=1)
    score, payload = q.entry(request)
    assert payload[0] in (entry.PLAIN, entry.DEFLATED)
    assert payload[1:].startswith(b"https://failed.example/1\x00parse_item\x00")
    q.send([failed.record_command(TAG, url=request.url, method=request.method,
                                  reason="timeout", score=score, request=payload, limit=10)])
    [record] = failed.read(client, TAG)
    assert failed.requeue(client, TAG, [record.id]) == 1
    [lease] = q.pop_leases(10)
    assert same(lease.request, request)


def test_a_crawlspiders_fields_are_deflated_and_the_last_releases_entries_still_read() -> None:
    """Format 2 deflates the fields other than the URL and callback with a preset
    dictionary: a CrawlSpider's request (its rule, link text and depth in meta) goes
    from 155 bytes to under 110. An entry of format 1 (the last release's, and this
    one's when deflating saves nothing) is still read."""
    codec = Codec(picklecompat, SPIDER)
    request = Request("https://docs.example.org/django-doc/html/ref/page-000000007.html",
                      callback=SPIDER.parse, priority=-2,
                      meta={"rule": 0, "link_text": "Model field reference", "depth": 2})
    payload = codec.encode(request)
    assert payload[0] == entry.DEFLATED and len(payload) < 110, len(payload)
    # What Scrapy's CrawlSpider really queues: the link text is lxml's str subclass,
    # and RefererMiddleware adds the page's URL as Referer: both cost a few bytes.
    from lxml import etree

    text = etree.fromstring("<a>Model field reference</a>").xpath("string()")
    real = request.replace(meta={**request.meta, "link_text": text},
                           headers={"Referer": "https://docs.example.org/django-doc/html/"
                                               "ref/index.html"})
    real_payload = codec.encode(real)
    assert len(real_payload) < 125, len(real_payload)
    assert same(codec.decode(real_payload), real)
    assert same(codec.decode(payload), request)
    url, cb, rest = payload[1:].split(entry.SEPARATOR, 2)
    plain = entry.SEPARATOR.join([bytes((entry.PLAIN,)) + url, cb, entry._inflate(rest, url)])
    assert same(codec.decode(plain), request)
    assert entry.peek(picklecompat, payload) == (request.url, "GET")
    # A request with nothing but a URL and a callback has nothing to deflate.
    assert codec.encode(Request("https://a.example/", callback=SPIDER.parse))[0] == entry.PLAIN
