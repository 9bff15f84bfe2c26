"""What to do with an HTTP write's answer: send on, retry later, split, or drop.

Pure functions: the answer, the attempt number, the current time and a random number in
[0, 1) are arguments, so every decision is unit-tested without a socket or a clock. Nothing
here sleeps or sends.
"""

from __future__ import annotations

import datetime
import json
import re
import time
from dataclasses import dataclass
from typing import Optional

SENT = "sent"
PARTIAL = "partial"
RETRY = "retry"
SPLIT = "split"
DROP = "drop"


@dataclass(frozen=True)
class Decision:
    """What the sender does with one batch after one attempt.

    ``action`` is one of ``sent`` (all points stored), ``partial`` (``rejected`` points
    refused as malformed, the rest stored), ``retry`` (send the same batch again after
    ``delay_s``; ``None`` means "use the backoff"), ``split`` (the batch is too large: send
    it in halves) or ``drop`` (retrying cannot help; ``reason`` says why)."""

    action: str
    delay_s: Optional[float] = None
    rejected: int = 0
    reason: str = ""


def backoff_delay(attempt: int, base_s: float, cap_s: float, rand: float) -> float:
    """Capped exponential backoff with equal jitter: attempt 1 waits between ``base_s/2``
    and ``base_s``, each later attempt up to twice as long, never more than ``cap_s``."""
    exp = min(cap_s, base_s * (2.0 ** max(0, attempt - 1)))
    return exp / 2.0 + (exp / 2.0) * rand


# The longest ``Retry-After`` honoured, whatever the answer says (the agent's own sinks use
# the same hour). The sender also never waits past its ``retry_timeout`` budget.
RETRY_AFTER_MAX_S = 3600.0

_MONTHS = {
    m: i
    for i, m in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1
    )
}
_DAY = "(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
_LONG_DAY = "(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday)"
_MONTH = "(" + "|".join(_MONTHS) + ")"
_TIME = "([0-9]{2}):([0-9]{2}):([0-9]{2})"
# RFC 9110 section 5.6.7: IMF-fixdate, and the obsolete RFC 850 and asctime forms that a
# recipient must still accept. ``[0-9]`` and the literal names match ASCII only.
_IMF_FIXDATE = re.compile(_DAY + ", ([0-9]{2}) " + _MONTH + " ([0-9]{4}) " + _TIME + " GMT")
_RFC850_DATE = re.compile(_LONG_DAY + ", ([0-9]{2})-" + _MONTH + "-([0-9]{2}) " + _TIME + " GMT")
_ASCTIME_DATE = re.compile(_DAY + " " + _MONTH + " ([0-9 ][0-9]) " + _TIME + " ([0-9]{4})")
_DELTA_SECONDS = re.compile("[0-9]+")


def parse_http_date(text: str, now_s: float) -> Optional[float]:
    """Seconds since the epoch of an RFC 9110 HTTP-date (``Sun, 06 Nov 1994 08:49:37 GMT``,
    ``Sunday, 06-Nov-94 08:49:37 GMT`` or ``Sun Nov  6 08:49:37 1994``); ``None`` for
    anything else, including an impossible date. A two-digit year is read as the most
    recent year with those digits that is not more than 50 years after ``now_s``."""
    m = _IMF_FIXDATE.fullmatch(text)
    if m is not None:
        day, month, year, hh, mm, ss = m.groups()
    else:
        m = _ASCTIME_DATE.fullmatch(text)
        if m is not None:
            month, day, hh, mm, ss, year = m.groups()
        else:
            m = _RFC850_DATE.fullmatch(text)
            if m is None:
                return None
            day, month, yy, hh, mm, ss = m.groups()
            this_year = time.gmtime(now_s).tm_year
            y = this_year - this_year % 100 + int(yy)
            if y > this_year + 50:
                y -= 100
            year = str(y)
    try:
        when = datetime.datetime(
            int(year), _MONTHS[month], int(day), int(hh), int(mm), int(ss),
            tzinfo=datetime.timezone.utc,
        )
    except ValueError:  # 31 Feb, hour 25, leap second 60, year 0
        return None
    return when.timestamp()


def parse_retry_after(value: Optional[str], now_s: float) -> Optional[float]:
    """Seconds to wait from a ``Retry-After`` header: ASCII delta-seconds or an HTTP-date
    (read against ``now_s``, seconds since the epoch), at most ``RETRY_AFTER_MAX_S``.
    ``None`` when absent or not one of those two forms exactly (a Unicode digit such as
    ``"٣"`` or ``"²"``, a sign, a fraction, another date format): the caller then uses its
    own backoff. Never raises."""
    if value is None:
        return None
    text = value.strip(" \t")
    if _DELTA_SECONDS.fullmatch(text):
        # Long digit strings are not converted (int() refuses over 4,300 digits): capped.
        seconds = float(int(text)) if len(text) <= 12 else RETRY_AFTER_MAX_S
        return min(seconds, RETRY_AFTER_MAX_S)
    when = parse_http_date(text, now_s)
    if when is None:
        return None
    return min(max(0.0, when - now_s), RETRY_AFTER_MAX_S)


def rejected_lines(body: bytes) -> Optional[int]:
    """How many lines a 400 answer names as refused (the agent's and InfluxDB's JSON
    ``line_errors``); ``None`` when the body does not say."""
    try:
        doc = json.loads(body.decode("utf-8", "replace"))
    except (ValueError, RecursionError):  # RecursionError: a deeply nested body
        return None
    if not isinstance(doc, dict):
        return None
    errors = doc.get("line_errors")
    if isinstance(errors, list) and errors:
        return len(errors)
    return None


def decide(
    status: Optional[int],
    retry_after: Optional[str],
    body: bytes,
    points: int,
    now_s: float,
) -> Decision:
    """The decision for one answer. ``status`` is ``None`` when no answer came (connection
    refused or reset, timeout): the agent may be restarting, so that is retried."""
    if status is None:
        return Decision(RETRY, reason="no answer from the agent")
    if 200 <= status < 300:
        return Decision(SENT)
    if status == 400:
        bad = rejected_lines(body)
        if bad is not None and bad < points:
            return Decision(PARTIAL, rejected=bad)
        return Decision(DROP, reason="the agent refused every line (400)")
    if status == 413:
        if points > 1:
            return Decision(SPLIT)
        return Decision(DROP, reason="one point is larger than the agent accepts (413)")
    if status in (429, 503):
        return Decision(
            RETRY,
            delay_s=parse_retry_after(retry_after, now_s),
            reason=f"the agent is busy ({status})",
        )
    if status in (401, 403):
        return Decision(DROP, reason=f"the agent refused the token ({status}): check token=")
    if status >= 500:
        return Decision(RETRY, reason=f"the agent failed ({status})")
    return Decision(DROP, reason=f"the agent answered {status}")
