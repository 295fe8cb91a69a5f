"""Start-up shim for the clock-skew chaos test's worker processes (its directory is put first on
``PYTHONPATH`` for those processes only).

* ``CHAOS_CLOCK_SKEW=<seconds>`` (used where libfaketime is not installed): shift Python's clock,
  ``time.time``/``time_ns`` and ``datetime.datetime.now``/``utcnow``/``today``. Django binds
  ``datetime.datetime`` after this runs, so ``timezone.now()`` is skewed too.
* ``CHAOS_SLEEP_SHIM=1`` (used with libfaketime): libfaketime 0.9.10 breaks the absolute
  ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)`` that Python 3.11+ ``time.sleep`` uses (EINVAL,
  or no wake-up), although it leaves ``select()`` and condition waits alone with
  ``FAKETIME_DONT_FAKE_MONOTONIC=1``. Sleep through ``select()`` instead. Only the test harness's
  environment changes; the queue's code is untouched.
"""

import datetime as _datetime
import os
import select as _select
import time as _time

_SKEW = float(os.environ.get("CHAOS_CLOCK_SKEW", "0") or 0)

if _SKEW:
    _real_time, _real_time_ns = _time.time, _time.time_ns
    _DELTA = _datetime.timedelta(seconds=_SKEW)

    def _time_skewed() -> float:
        return _real_time() + _SKEW

    def _time_ns_skewed() -> int:
        return _real_time_ns() + int(_SKEW * 1_000_000_000)

    class _SkewedDateTime(_datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return super().now(tz) + _DELTA

        @classmethod
        def utcnow(cls):
            return super().now(_datetime.UTC).replace(tzinfo=None) + _DELTA

        @classmethod
        def today(cls):
            return cls.now()

    _time.time, _time.time_ns = _time_skewed, _time_ns_skewed
    _datetime.datetime = _SkewedDateTime

if os.environ.get("CHAOS_SLEEP_SHIM") == "1":
    _monotonic = _time.monotonic

    def _sleep(seconds: float) -> None:
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")
        deadline = _monotonic() + seconds
        while (left := deadline - _monotonic()) > 0:
            _select.select([], [], [], left)

    _time.sleep = _sleep
