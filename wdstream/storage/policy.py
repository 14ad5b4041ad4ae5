"""How hard a remote store tries and for how long, and which HTTP statuses are worth another
attempt (docs/STORAGE.md, "Retry policy" and "Time limits")."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RetryPolicy", "transient_status"]


@dataclass(frozen=True)
class RetryPolicy:
    """How hard a remote store tries, and for how long (docs/STORAGE.md says why these).

    Attributes:
        retries: attempts after the first one before giving up (per read: consecutive
            attempts that brought no new byte).
        backoff: first delay in seconds; doubles per attempt up to ``max_backoff``.
        max_backoff: cap of one delay (also caps a server's ``Retry-After``).
        connect_timeout: seconds to open a connection.
        read_timeout: seconds to wait for the next bytes of a response.
        deadline: seconds one GET may take from connecting to its last byte, plus
            ``bytes / min_throughput``; a GET past it is cut and resumed.
        min_throughput: bytes per second a GET is expected to sustain beyond ``deadline``.
        budget: seconds an operation may go without progress, over all its attempts; no
            retry starts after it (an attempt in flight still ends by its own timeouts).
    """

    retries: int = 5
    backoff: float = 0.25
    max_backoff: float = 10.0
    connect_timeout: float = 5.0
    read_timeout: float = 15.0
    deadline: float = 30.0
    min_throughput: float = float(1 << 20)
    budget: float = 60.0

    @classmethod
    def from_options(
        cls,
        retries: int | None = None,
        timeout: float | tuple[float, float] | None = None,
        backoff: float | None = None,
        max_backoff: float | None = None,
        deadline: float | None = None,
        min_throughput: float | None = None,
        budget: float | None = None,
    ) -> RetryPolicy:
        """Build a policy from ``open_store`` options; ``timeout`` is one number or a
        ``(connect, read)`` pair; options left as None keep their defaults.

        Raises:
            ValueError: for a negative count or delay, or a time limit that is not > 0.
        """
        kw: dict[str, float | int] = {}
        if retries is not None:
            if retries < 0:
                raise ValueError(f"retries must be >= 0, got {retries!r}")
            kw["retries"] = int(retries)
        if backoff is not None:
            if backoff < 0:
                raise ValueError(f"backoff must be >= 0, got {backoff!r}")
            kw["backoff"] = float(backoff)
        if max_backoff is not None:
            kw["max_backoff"] = float(max_backoff)
        if timeout is not None:
            connect, read = timeout if isinstance(timeout, tuple) else (timeout, timeout)
            if connect <= 0 or read <= 0:
                raise ValueError(f"timeout must be > 0, got {timeout!r}")
            kw["connect_timeout"], kw["read_timeout"] = float(connect), float(read)
        limits = {"deadline": deadline, "min_throughput": min_throughput, "budget": budget}
        for key, value in limits.items():
            if value is not None:
                if value <= 0:
                    raise ValueError(f"{key} must be > 0, got {value!r}")
                kw[key] = float(value)
        return cls(**kw)  # type: ignore[arg-type]

    def request_time(self, nbytes: int) -> float:
        """Seconds one GET of ``nbytes`` may take, connect to last byte."""
        return self.deadline + nbytes / self.min_throughput


# Statuses that repeating the same request cannot fix although they are 5xx: the server does
# not implement the method or HTTP version (501, 505), is misconfigured (506, 508, 510),
# wants a captive-portal login (511), or is out of space (507, which outlasts any backoff).
_PERMANENT_5XX = frozenset({501, 505, 506, 507, 508, 510, 511})
# 4xx that do heal: the server timed out waiting for us (408), too early (425), throttling.
_TRANSIENT_4XX = frozenset({408, 425, 429})


def transient_status(status: int) -> bool:
    """Whether an HTTP status is worth another attempt of the same request."""
    return status in _TRANSIENT_4XX or (status >= 500 and status not in _PERMANENT_5XX)
