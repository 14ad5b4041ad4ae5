"""Retry policy, resuming reads and redaction, without any network; plus ``open_store``."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wdstream.errors import WdstreamError
from wdstream.storage import (
    LocalStore,
    RemoteReadError,
    RemoteWriteError,
    RetryPolicy,
    open_store,
    redact_url,
    split_url,
)
from wdstream.storage.body import iter_limited
from wdstream.storage.retry import Retrier, TransientError, redact_text

pytestmark = pytest.mark.timeout(30)

DATA = bytes(range(256)) * 40  # 10,240 bytes


class FlakyFetch:
    """``fetch`` over DATA whose responses break after ``cuts[i]`` bytes (None: whole)."""

    def __init__(self, cuts: list[int | None], error: Exception | None = None) -> None:
        self.cuts = list(cuts)
        self.error = error
        self.calls: list[tuple[int, int | None]] = []

    def __call__(self, start: int, end: int | None) -> tuple[int, Iterable[bytes]]:
        self.calls.append((start, end))
        body = DATA[start:end]
        cut = self.cuts.pop(0) if self.cuts else None

        def chunks() -> Iterator[bytes]:
            sent = body if cut is None else body[:cut]
            for i in range(0, len(sent), 100):
                yield sent[i : i + 100]
            if cut is not None and self.error is not None:
                raise self.error

        return len(body), chunks()


def _retrier(retries: int = 3, sleeps: list[float] | None = None) -> Retrier:
    record = sleeps if sleeps is not None else []
    return Retrier(
        RetryPolicy(retries=retries, backoff=0.1, max_backoff=1.0),
        lambda exc: isinstance(exc, ConnectionResetError),
        random.Random(0),
        sleep=record.append,
    )


def test_resumes_from_last_byte() -> None:
    fetch = FlakyFetch([250, 1_000, None])
    assert _retrier().read(fetch, "u", 100, 5_000) == DATA[100:5_000]
    assert fetch.calls == [(100, 5_000), (350, 5_000), (1_350, 5_000)]


def test_resumes_after_connection_reset_too() -> None:
    fetch = FlakyFetch([300, None], error=ConnectionResetError("reset by peer"))
    assert _retrier().read(fetch, "u", 0, None) == DATA
    assert fetch.calls == [(0, None), (300, None)]


def test_budget_counts_failures_without_progress() -> None:
    # Ten failures in a row, but each brought bytes: the read completes with retries=1.
    fetch = FlakyFetch([500] * 10 + [None])
    assert _retrier(retries=1).read(fetch, "u", 0, 8_000) == DATA[:8_000]
    # Stuck at byte 0: gives up after 1 + retries attempts, naming the offset and cause.
    stuck = FlakyFetch([0] * 10)
    with pytest.raises(RemoteReadError) as info:
        _retrier(retries=2).read(stuck, "s3://b/k.tar", 0, 8_000)
    assert len(stuck.calls) == 3
    err = info.value
    assert (err.url, err.offset) == ("s3://b/k.tar", 0)
    assert "truncated body: 0 of 8000 bytes" in err.cause and "s3://b/k.tar" in str(err)


def test_a_cut_that_brought_bytes_resumes_at_once() -> None:
    # Every response cut after 500 new bytes: no sleep at all; a failure without progress
    # after progress sleeps the first backoff again, not a grown one.
    sleeps: list[float] = []
    fetch = FlakyFetch([500] * 10 + [None], error=ConnectionResetError("reset"))
    assert _retrier(retries=1, sleeps=sleeps).read(fetch, "u", 0, 8_000) == DATA[:8_000]
    assert sleeps == [] and len(fetch.calls) == 11
    stalled = FlakyFetch([500, 0, 500, 0, None], error=ConnectionResetError("reset"))
    assert _retrier(retries=1, sleeps=sleeps).read(stalled, "u", 0, 8_000) == DATA[:8_000]
    assert len(sleeps) == 2 and max(sleeps) <= 0.1


def test_offset_in_error_is_the_first_missing_byte() -> None:
    fetch = FlakyFetch([700, 0, 0, 0], error=ConnectionResetError("reset"))
    with pytest.raises(RemoteReadError, match="at byte 1700 .*ConnectionResetError: reset"):
        _retrier(retries=2).read(fetch, "u", 1_000, 9_000)


# Every kind of error the retrier must not repeat: those it passes through as they are (a
# missing object, a refusal, a bad request argument, a store error already decided), and
# one its backend calls permanent (here RuntimeError), which becomes the store's error.
_PASSED_THROUGH = [
    FileNotFoundError("no such object: u"),
    PermissionError("403 forbidden: u"),
    ValueError("bad range"),
    RemoteReadError("already failed", "u", "c", 0),
    RemoteWriteError("already failed", "u", "c", 0),
]


@pytest.mark.parametrize("error", _PASSED_THROUGH, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("how", ["read", "call"])
def test_permanent_errors_are_not_retried(error: Exception, how: str) -> None:
    # The backend's predicate would retry anything: only the retrier's own rule stops these.
    sleeps: list[float] = []
    r = Retrier(RetryPolicy(retries=3, backoff=0.1), lambda exc: True, random.Random(0),
                sleep=sleeps.append)  # fmt: skip
    attempts: list[int] = []

    def fetch(start: int, end: int | None) -> tuple[int, Iterable[bytes]]:
        attempts.append(start)
        raise error

    with pytest.raises(type(error)) as info:
        if how == "read":
            r.read(fetch, "u", 0, 10)
        else:
            r.call(lambda: fetch(0, None), "GET", "u")
    assert info.value is error  # passed through, not wrapped
    assert (attempts, sleeps) == ([0], [])


@pytest.mark.parametrize("how", ["read", "call"])
def test_errors_the_backend_calls_permanent_are_not_retried(how: str) -> None:
    sleeps: list[float] = []
    attempts: list[int] = []

    def fetch(start: int, end: int | None) -> tuple[int, Iterable[bytes]]:
        attempts.append(start)
        raise RuntimeError("400 bad request")

    with pytest.raises(RemoteReadError, match=r"\(not retried\): RuntimeError: 400 bad request"):
        if how == "read":
            _retrier(sleeps=sleeps).read(fetch, "u", 0, 10)
        else:
            _retrier(sleeps=sleeps).call(lambda: fetch(0, None), "GET", "u")
    assert (attempts, sleeps) == ([0], [])


def test_call_retries_then_raises_the_given_error() -> None:
    attempts: list[int] = []

    def op() -> int:
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionResetError("reset")
        return 42

    assert _retrier().call(op, "HEAD", "u") == 42

    def always() -> None:
        raise ConnectionResetError("reset")

    with pytest.raises(RemoteWriteError, match="PUT u failed after 4 attempts"):
        _retrier(retries=3).call(always, "PUT", "u", RemoteWriteError)


def test_backoff_grows_with_jitter_and_cap() -> None:
    sleeps: list[float] = []
    r = _retrier(retries=6, sleeps=sleeps)
    for attempt in range(1, 7):
        base = min(1.0, 0.1 * 2 ** (attempt - 1))
        for _ in range(20):
            assert base / 2 <= r.delay(attempt) <= base
    assert r.delay(1, retry_after=0.7) >= 0.7
    assert r.delay(1, retry_after=100.0) <= 1.0  # capped by max_backoff
    fetch = FlakyFetch([0, 0, 0, None])
    r.read(fetch, "u", 0, 100)
    assert len(sleeps) == 3 and sleeps[0] < sleeps[2]


def test_transient_error_carries_retry_after() -> None:
    sleeps: list[float] = []
    r = Retrier(RetryPolicy(retries=1, backoff=0.0), lambda e: False, sleep=sleeps.append)
    state = {"n": 0}

    def op() -> str:
        state["n"] += 1
        if state["n"] == 1:
            raise TransientError("HTTP 429", retry_after=0.25)
        return "ok"

    assert r.call(op, "GET", "u") == "ok"
    assert sleeps == [0.25]


def test_policy_from_options() -> None:
    p = RetryPolicy.from_options(retries=2, timeout=3.0, backoff=0.5)
    assert (p.retries, p.connect_timeout, p.read_timeout, p.backoff) == (2, 3.0, 3.0, 0.5)
    assert RetryPolicy.from_options(timeout=(1.0, 30.0)).read_timeout == 30.0
    q = RetryPolicy.from_options(deadline=2, min_throughput=1000, budget=7)
    assert (q.deadline, q.min_throughput, q.budget) == (2.0, 1000.0, 7.0)
    assert q.request_time(5_000) == 2.0 + 5.0
    bad_options: list[dict[str, float]] = [
        {"retries": -1}, {"timeout": 0}, {"backoff": -1.0},
        {"deadline": 0}, {"min_throughput": -1}, {"budget": 0},
    ]  # fmt: skip
    for bad in bad_options:
        with pytest.raises(ValueError, match=next(iter(bad))):
            RetryPolicy.from_options(**bad)  # type: ignore[arg-type]


class FakeClock:
    """Monotonic time that moves only when told to (or when the retrier sleeps)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _timed_retrier(clock: FakeClock, **policy: float) -> Retrier:
    return Retrier(
        RetryPolicy(**{"retries": 3, "backoff": 0.1, **policy}),  # type: ignore[arg-type]
        lambda exc: isinstance(exc, ConnectionResetError),
        random.Random(0),
        sleep=clock.sleep,
        clock=clock,
    )


class PacedFetch:
    """``fetch`` over DATA whose n-th response sends 100-byte chunks ``paces[n]`` seconds
    apart on ``clock`` (the last pace repeats)."""

    def __init__(self, clock: FakeClock, paces: list[float]) -> None:
        self.clock, self.paces = clock, paces
        self.calls: list[tuple[int, int | None]] = []

    def __call__(self, start: int, end: int | None) -> tuple[int, Iterable[bytes]]:
        pace = self.paces[min(len(self.calls), len(self.paces) - 1)]
        self.calls.append((start, end))
        body = DATA[start:end]

        def chunks() -> Iterator[bytes]:
            for i in range(0, len(body), 100):
                self.clock.sleep(pace)
                yield body[i : i + 100]

        return len(body), chunks()


def test_deadline_cuts_a_slow_response_and_resumes_after_its_last_byte() -> None:
    clock = FakeClock()
    # 1,000 bytes may take 3 s + 1,000 B / (1,000 B/s) = 4 s. The first response sends a
    # chunk per second and is cut at its 5th (500 bytes, 5 s); the second brings the rest.
    fetch = PacedFetch(clock, [1.0, 0.0])
    r = _timed_retrier(clock, deadline=3.0, min_throughput=1_000.0)
    assert r.read(fetch, "u", 0, 1_000) == DATA[:1_000]
    assert fetch.calls == [(0, 1_000), (500, 1_000)]


def test_a_trickle_counts_as_no_progress_and_fails_naming_the_offset() -> None:
    clock = FakeClock()
    fetch = PacedFetch(clock, [1.0])  # every response trickles
    r = _timed_retrier(clock, retries=2, deadline=1.5, min_throughput=1e9, budget=1e6)
    with pytest.raises(RemoteReadError) as info:
        r.read(fetch, "http://h/s.tar", 0, 10_000)
    err = info.value
    # 3 attempts (1 + 2 retries) of 2 chunks each, every one cut at its deadline.
    assert len(fetch.calls) == 3 and err.offset == 600
    assert [start for start, _ in fetch.calls] == [0, 200, 400]
    assert "DeadlineExceeded" in err.cause and "without progress" in str(err)


def test_deadline_grows_with_the_bytes_asked() -> None:
    clock = FakeClock()
    fetch = PacedFetch(clock, [0.05])  # 2,000 B/s: 5 s for DATA, within 1 s + 10,240 B / 1,000 B/s
    r = _timed_retrier(clock, deadline=1.0, min_throughput=1_000.0)
    assert r.read(fetch, "u", 0, None) == DATA
    assert len(fetch.calls) == 1


def test_budget_stops_retries_of_a_read_without_progress() -> None:
    clock = FakeClock()

    def hung(start: int, end: int | None) -> tuple[int, Iterable[bytes]]:
        clock.sleep(10.0)  # a read timeout of 10 s, each time
        raise ConnectionResetError("read timed out")

    r = _timed_retrier(clock, retries=100, budget=25.0)
    with pytest.raises(RemoteReadError, match=r"at byte 0 failed after 3 attempts .*25s budget"):
        r.read(hung, "u", 0, 10)
    assert 30.0 <= clock.now < 31.0  # no retry started after the 25 s budget


def test_budget_stops_retries_of_a_call() -> None:
    clock = FakeClock()
    calls: list[float] = []

    def put() -> None:
        calls.append(clock.now)
        clock.sleep(4.0)
        raise ConnectionResetError("reset")

    r = _timed_retrier(clock, retries=100, budget=10.0)
    with pytest.raises(RemoteWriteError, match=r"PUT u failed after 3 attempts .*10s budget"):
        r.call(put, "PUT", "u", RemoteWriteError)
    assert len(calls) == 3


def test_progress_restarts_the_budget() -> None:
    clock = FakeClock()
    # Each response brings 200 bytes in 8 s, then the connection resets: 40 s in all, far
    # past a 20 s budget, but never 20 s without a new byte.
    fetch = FlakyFetch([200] * 5 + [None], error=ConnectionResetError("reset"))

    def slow(start: int, end: int | None) -> tuple[int, Iterable[bytes]]:
        clock.sleep(8.0)
        return fetch(start, end)

    r = _timed_retrier(clock, retries=1, budget=20.0)
    assert r.read(slow, "u", 0, 2_000) == DATA[:2_000]
    assert clock.now > 40.0


def test_error_types() -> None:
    err = RemoteReadError("m", "u", "c", 5)
    assert isinstance(err, WdstreamError) and isinstance(err, OSError)
    assert issubclass(RemoteWriteError, OSError)


@pytest.mark.parametrize(
    ("url", "want"),
    [
        ("https://user:pw@host.example/a/b.tar", "https://***@host.example/a/b.tar"),
        ("https://host/a?X-Amz-Signature=abc&X-Amz-Credential=k", "https://host/a?<redacted>"),
        ("s3://bucket/prefix/x.tar", "s3://bucket/prefix/x.tar"),
        ("http://host:8080/p/", "http://host:8080/p/"),
    ],
)
def test_redact_url(url: str, want: str) -> None:
    assert redact_url(url) == want


def test_redact_text() -> None:
    text = (
        "Max retries exceeded with url: /a/b.tar?sig=SECRET1 (http://bob:SECRET2@h/x) "
        "headers {'Authorization': 'AWS4-HMAC-SHA256 SECRET3'} password=SECRET4, "
        "x-amz-security-token: SECRET5 token=SECRET6&part=2"
    )
    assert redact_text(text) == (
        "Max retries exceeded with url: /a/b.tar?<redacted> (http://***@h/x) "
        "headers {'Authorization': <redacted>} password=<redacted>, "
        "x-amz-security-token: <redacted> token=<redacted>&part=2"
    )
    # text without secrets is left as it is
    plain = "GET https://host:8080/data/s-000001.tar failed: HTTP 503 Slow Down (retry 2/5)"
    assert redact_text(plain) == plain


@given(
    data=st.binary(max_size=300),
    sizes=st.lists(st.integers(1, 50), min_size=1, max_size=10),
    skip=st.integers(0, 350),
    limit=st.one_of(st.none(), st.integers(0, 350)),
)
def test_iter_limited_is_a_slice(
    data: bytes, sizes: list[int], skip: int, limit: int | None
) -> None:
    def chunks() -> Iterator[bytes]:
        i = k = 0
        while i < len(data):
            n = sizes[k % len(sizes)]
            yield data[i : i + n]
            i, k = i + n, k + 1

    want = data[skip:] if limit is None else data[skip : skip + limit]
    assert b"".join(iter_limited(chunks(), skip, limit)) == want


def test_open_store_dispatch_and_refusals(tmp_path: object) -> None:
    from wdstream.storage.http import HttpStore
    from wdstream.storage.s3 import S3Store

    assert isinstance(open_store("s3://bucket/prefix"), S3Store)
    assert isinstance(open_store("https://host.example/data/"), HttpStore)
    assert isinstance(open_store("http://host.example/data"), HttpStore)
    assert isinstance(open_store(str(tmp_path)), LocalStore)
    with pytest.raises(ValueError, match="refused"):
        open_store("pipe:curl -s http://x/a.tar")
    with pytest.raises(ValueError, match="not implemented"):
        open_store("pipe:cat a.tar", allow_pipe=True)
    with pytest.raises(ValueError, match="unsupported storage URL 'gs://b/p'"):
        open_store("gs://b/p")
    with pytest.raises(TypeError, match="part_size"):
        open_store(str(tmp_path), part_size=1)
    with pytest.raises(TypeError):
        open_store("https://host/x", part_size=1)


def test_split_url() -> None:
    assert split_url("s3://bucket/a/b.tar") == ("s3://bucket/a", "b.tar")
    assert split_url("s3://bucket/b.tar") == ("s3://bucket", "b.tar")
    assert split_url("https://h/x/y/s-000001.tar") == ("https://h/x/y", "s-000001.tar")
    assert split_url("https://h/x/s.tar?sig=1") == ("https://h/x?sig=1", "s.tar")
    assert split_url("data/s.tar") == ("data", "s.tar")
    assert split_url("s.tar") == (".", "s.tar")
