"""``with rec.generate(...) as g``: the latency of one LLM request (time to first token,
inter-token gaps, tokens per second), written as ``llm`` points.

The hot path is :meth:`Generation.token`: it appends one ``perf_counter_ns`` reading to a
list (and, for a chunk of several tokens, one pair to a second list) and does nothing else.
Leaving the block computes the request's fields from those readings and appends one queue
item to the recorder's bounded queue; the sender thread turns the readings into the
per-gap ``itl_ms`` lines (:func:`itl_points`). Nothing here raises because of the
transport; an exception inside the block is recorded as ``ok=false`` and re-raised.
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Tuple, Type

if TYPE_CHECKING:  # pragma: no cover
    from ._recorder import Recorder
    from ._sender import TagPairs

__all__ = ["Generation", "LLM", "itl_points", "decode_rate"]

LLM = "llm"

_perf_ns = time.perf_counter_ns
_time_ns = time.time_ns

# (index of the reading, tokens it carried) for readings of more than one token
Multi = List[Tuple[int, int]]


def decode_rate(output_tokens: int, e2e_ms: float, ttft_ms: Optional[float]) -> Optional[float]:
    """``tokens_per_s``: ``(output_tokens - 1) / ((e2e_ms - ttft_ms) / 1000)``, the decode
    speed after the first token (so ``1 / tokens_per_s`` is the mean inter-token latency);
    ``None`` without a first token, with fewer than two tokens or no decode time."""
    if ttft_ms is None or output_tokens <= 1:
        return None
    decode_ms = e2e_ms - ttft_ms
    if decode_ms <= 0:
        return None
    return (output_tokens - 1) / (decode_ms / 1000.0)


def itl_points(
    times: List[int], multi: Optional[Multi], perf_end: int, wall_end: int
) -> Iterator[Tuple[int, float]]:
    """``(timestamp_ns, itl_ms)`` for each gap between two token readings: stamped at the
    later reading's wall-clock time (``wall_end`` minus how long before ``perf_end`` it was
    taken), strictly increasing (a tie is bumped by 1 ns) and before ``wall_end``. A
    reading of ``n`` tokens is one gap worth ``gap / n``."""
    if len(times) < 2:
        return
    per: Dict[int, int] = dict(multi) if multi else {}
    prev_ts = -1
    prev_t = times[0]
    for i in range(1, len(times)):
        t = times[i]
        ts = wall_end - (perf_end - t)
        if ts <= prev_ts:
            ts = prev_ts + 1
        gap = (t - prev_t) / 1e6
        n = per.get(i, 1)
        yield ts, (gap / n if n > 1 else gap)
        prev_ts = ts
        prev_t = t


class Generation:
    """One LLM request being timed: returned by :meth:`Recorder.generate`.

    ``token(n=1)`` marks the arrival of ``n`` tokens (the first call is the first token);
    ``done(output_tokens=None)`` ends the timing before the block ends and/or gives the
    token count the server reported; ``set(**fields)`` adds fields (``queue_ms``,
    ``prompt_tokens``). Leaving the block writes the ``llm`` point and the ``itl_ms``
    points."""

    __slots__ = (
        "_rec", "_tags", "fields", "_t0", "_times", "_multi", "_end", "_n_at_end",
        "_reported", "_failed", "_exited",
    )

    def __init__(self, rec: "Recorder", tags: "TagPairs", fields: Dict[str, object]) -> None:
        self._rec = rec
        self._tags = tags
        self.fields = fields
        self._t0 = 0
        self._times: List[int] = []
        self._multi: Multi = []
        self._end = 0
        self._n_at_end = -1
        self._reported: Optional[int] = None
        self._failed = False
        self._exited = False

    def __enter__(self) -> "Generation":
        self._t0 = _perf_ns()
        return self

    def token(self, n: int = 1) -> None:
        """``n`` tokens arrived now (one chunk of ``n`` tokens is one inter-token gap,
        worth ``gap / n``). Only reads the clock; ``n < 1`` is ignored."""
        times = self._times
        times.append(_perf_ns())
        if n != 1:
            if n >= 1:
                self._multi.append((len(times) - 1, int(n)))
            else:
                times.pop()

    def done(self, output_tokens: Optional[int] = None, *, ok: Optional[bool] = None) -> None:
        """Ends the timing now (``e2e_ms``; tokens marked later are ignored) unless it was
        ended already. ``output_tokens``: the count the server reported (then
        ``tokens_counted`` is ``false``); ``ok=False`` records the request as failed even
        without an exception (a stream abandoned half-way)."""
        if self._n_at_end < 0:
            self._end = _perf_ns()
            self._n_at_end = len(self._times)
        if output_tokens is not None:
            self._reported = int(output_tokens)
        if ok is not None:
            self._failed = not ok

    def set(self, **fields: object) -> "Generation":
        """Adds fields to the request's point (``g.set(queue_ms=3.2, prompt_tokens=41)``);
        keep each field's type the same across points."""
        self.fields.update(fields)
        return self

    @property
    def tokens(self) -> int:
        """Tokens marked so far (``token(n)`` counts ``n``)."""
        times = self._times
        return len(times) + sum(n - 1 for _, n in self._multi)

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if self._exited:
            return
        self._exited = True
        if self._n_at_end < 0:
            self.done()
        now = _perf_ns()
        wall_now = _time_ns()
        times = self._times
        n = self._n_at_end
        if n < len(times):
            del times[n:]
        multi = self._multi
        if multi and n and multi[-1][0] >= n:
            multi = [m for m in multi if m[0] < n]
        t0 = self._t0
        end = self._end
        if times and end <= times[-1]:
            end = times[-1] + 1  # the request's point comes after its last gap's
        wall_end = wall_now - (now - end)
        fields = self.fields
        e2e_ms = (end - t0) / 1e6
        fields["e2e_ms"] = e2e_ms
        ttft_ms: Optional[float] = None
        if times:
            ttft_ms = (times[0] - t0) / 1e6
            fields["ttft_ms"] = ttft_ms
        reported = self._reported
        if reported is None or reported >= 0:  # -1: the count is unknown, left out
            output = len(times) + sum(k - 1 for _, k in multi) if reported is None else reported
            fields["output_tokens"] = output
            fields["tokens_counted"] = reported is None
            rate = decode_rate(output, e2e_ms, ttft_ms)
            if rate is not None:
                fields["tokens_per_s"] = rate
        fields["ok"] = exc_type is None and not self._failed
        gaps = len(times) - 1 if len(times) > 1 else 0
        self._rec._submit_llm(
            self._tags, fields, wall_end, (times, multi or None, end) if gaps else None, 1 + gaps
        )


_new_generation = Generation.__new__
