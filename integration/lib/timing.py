"""Time for the tests: the daemons' wall clock in ms, bounded waits (deadline
polling, never fixed sleeps) and counting events in a sliding window."""
from __future__ import annotations

import http.client
import time


def now_ms() -> int:
    """Wall clock in ms since the epoch (the clock the daemons use)."""
    return time.time_ns() // 1_000_000


class WaitTimeout(AssertionError):
    """A bounded wait ran out; an AssertionError so unittest reports a failure."""


#: What wait_until() treats as "not yet" besides a falsy value: connection-level
#: errors while a daemon or backend starts, restarts or goes away (refused, reset,
#: timed out: all OSError, urllib.error.URLError included) and a half-written HTTP
#: answer. Anything else - an AssertionError above all - is a failure.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (OSError, http.client.HTTPException)


def wait_until(predicate, timeout: float = 5.0, interval: float = 0.02, message: str = "",
               retry_on: tuple[type[BaseException], ...] = TRANSIENT_ERRORS):
    """Polls predicate() until it returns something truthy, which is returned.

    A falsy value means "not yet", and so does an exception of a type in
    `retry_on` (by default TRANSIENT_ERRORS: e.g. connection refused while a daemon
    starts). Every other exception propagates at once: an assertion inside a
    predicate fails the test, it is never taken for "not yet". On timeout the
    last value and the last transient error are reported.
    """
    deadline = time.monotonic() + timeout
    last_exc = None
    last_value = None
    while True:
        try:
            last_value = predicate()
            if last_value:
                return last_value
        except retry_on as e:
            last_exc = e
        if time.monotonic() >= deadline:
            detail = f"; last value: {last_value!r}"
            if last_exc is not None:
                detail += f"; last error: {last_exc!r}"
            raise WaitTimeout(f"timed out after {timeout}s waiting for {message or predicate}{detail}") from last_exc
        time.sleep(interval)


def max_in_window(ts: list[float], w: float) -> int:
    """Largest number of (sorted) times in any half-open window [t, t+w)."""
    best, j = 0, 0
    for i in range(len(ts)):
        while ts[i] - ts[j] >= w:
            j += 1
        best = max(best, i - j + 1)
    return best
