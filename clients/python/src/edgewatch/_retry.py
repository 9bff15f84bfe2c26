"""What to do with an HTTP write's answer: send on, retry later, split, or drop.

Pure functions: the answer, the attempt number, the current time and a random number in
[0, 1) are arguments, so every decision is unit-tested without a socket or a clock. Nothing
here sleeps or sends.
"""

from __future__ import annotations

import email.utils
import json
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


def parse_retry_after(value: Optional[str], now_s: float) -> Optional[float]:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date, read
    against ``now_s``, seconds since the epoch); ``None`` when absent or unreadable."""
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - now_s)


def rejected_lines(body: bytes) -> Optional[int]:
    """How many lines a 400 answer names as refused (the agent's and InfluxDB's JSON
    ``line_errors``); ``None`` when the body does not say."""
    try:
        doc = json.loads(body.decode("utf-8", "replace"))
    except ValueError:
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
