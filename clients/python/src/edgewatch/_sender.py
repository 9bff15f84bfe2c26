"""The bounded queue between the application and the agent, and the one sender thread that
empties it.

The application's threads only append to the queue (or, when it is full, drop the point and
count it): they never wait for the sender, the network or the GPU. The sender thread waits
for GPU events to complete, encodes lines, packs them into UDP datagrams or HTTP bodies,
sends them, and retries HTTP writes with backoff (honouring ``Retry-After``, never past
the ``retry_timeout`` budget), halving a batch the agent found too large (413) and growing
it back once 413s stop. Nothing here raises into the application: failures become counters
and rate-limited log records on the ``edgewatch`` logger.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
import weakref
from collections import deque
from typing import Any, Deque, Dict, List, Mapping, Optional, Tuple, Union

from . import _line, _llm
from ._gpu import GpuClock, Span
from ._retry import DROP, PARTIAL, RETRY, SENT, SPLIT, backoff_delay, decide
from ._transport import HttpTransport, UdpTransport

log = logging.getLogger("edgewatch")

TagPairs = Tuple[Tuple[str, str], ...]
# measurement, per-point tags, fields, timestamp (ns), GPU spans to resolve (or None);
# an ``llm`` request's item has a sixth element: its token readings (perf_counter_ns), the
# readings of several tokens and the request's end (perf_counter_ns), from which the sender
# writes one ``itl_ms`` line per gap (``_llm.itl_points``).
Item = Tuple[Any, ...]

_WARN_EVERY_S = 60.0
_TAG_CACHE_MAX = 4096
# The sender gives the GIL back after encoding this many points (~2 µs each), so that the
# application's thread never waits for it longer than that: Python would otherwise let a
# busy sender keep the GIL for a whole switch interval (5 ms) before handing it over.
_YIELD_EVERY = 16
# The same for an ``llm`` request's ``itl_ms`` lines, which cost about a fifth as much.
_YIELD_GAPS = 64
# After a 413 the HTTP batch stays at the size that was last accepted for this long (since
# the last 413), then doubles with each accepted batch back to ``batch_points``: a limit
# that lasts costs one refused body per period, one that went away (a proxy reconfigured,
# a burst of unusually long lines) no longer halves every later batch.
_SPLIT_HOLD_S = 30.0

# Every running pipeline, for the fork handler below.
_live: "weakref.WeakSet[Pipeline]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for pipeline in list(_live):
        pipeline.after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Pipeline:
    """Queue, counters and sender thread of one recorder."""

    def __init__(
        self,
        transport: Union[UdpTransport, HttpTransport],
        *,
        capacity: int,
        batch_points: int,
        max_datagram_bytes: int,
        flush_interval_s: float,
        gpu_poll_s: float,
        gpu_timeout_s: float,
        retry_timeout_s: float,
        backoff_base_s: float,
        backoff_max_s: float,
        precision: str,
        base_tags: Mapping[str, str],
        clock: GpuClock,
    ) -> None:
        if capacity < 1:
            raise ValueError("queue_size must be at least 1")
        if batch_points < 1:
            raise ValueError("batch_points must be at least 1")
        self.queue: Deque[Item] = deque()
        self.capacity = capacity
        # The hot path wakes the sender early once this many points wait.
        self.wake_at = max(1, min(batch_points, capacity) // 2)
        self.wake = threading.Event()
        self.drop_lock = threading.Lock()
        self.sent = 0
        self.dropped = 0
        self.errors = 0
        self.gpu_timeouts = 0
        self._transport = transport
        self._udp = isinstance(transport, UdpTransport)
        self._batch_points = batch_points
        self._http_batch = batch_points
        self._split_hold_s = _SPLIT_HOLD_S
        self._last_split: Optional[float] = None
        self._max_datagram = max_datagram_bytes
        self._flush_interval = flush_interval_s
        self._gpu_poll = gpu_poll_s
        self._gpu_timeout = gpu_timeout_s
        self._retry_timeout = retry_timeout_s
        self._backoff = (backoff_base_s, backoff_max_s)
        self._divisor = _line.precision_divisor(precision)
        self._base_tags = dict(base_tags)
        self._tag_cache: Dict[TagPairs, str] = {}
        self._clock = clock
        self._pending: Deque[Tuple[float, Item]] = deque()
        self._ready: List[str] = []
        self._encoded = 0
        self._attempt = 0
        self._first_failure: Optional[float] = None
        self._retry_at: Optional[float] = None
        self._stop_deadline: Optional[float] = None
        # Sends go out at most once a flush interval (a full batch, a flush or the close
        # send at once): each HTTP request is one synced commit on the device.
        self._last_send = time.monotonic()
        self._flush_wanted = False
        self._progress = threading.Condition()
        self._warned: Dict[str, Tuple[float, int]] = {}
        self._thread = self._start_thread()
        _live.add(self)

    def _start_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="edgewatch-sender", daemon=True)
        thread.start()
        return thread

    def after_fork_in_child(self) -> None:
        """In a child made by ``fork``: the sender thread did not come along, and a lock it
        held would never be released. Resets the locks, forgets the parent's points (the
        parent sends them) and its connection, and starts a sender for the child."""
        for lock in (self.wake, self.drop_lock, self._progress):
            reinit = getattr(lock, "_at_fork_reinit", None)
            if reinit is not None:
                reinit()
        self.queue.clear()
        self._pending.clear()
        self._ready = []
        self.sent = self.dropped = self.errors = self.gpu_timeouts = 0
        self._attempt, self._first_failure, self._retry_at = 0, None, None
        self._transport.forget()
        if self._stop_deadline is None:
            self._thread = self._start_thread()

    # ---- called from the application's threads --------------------------------------

    def count_drop(self, points: int = 1) -> None:
        with self.drop_lock:
            self.dropped += points

    def queued(self) -> int:
        """Points not yet sent nor given up: queued, waiting on the GPU, or being sent."""
        return len(self.queue) + len(self._pending) + len(self._ready)

    def flush(self, timeout_s: float) -> bool:
        """Waits until every point recorded so far was sent (or given up); ``False`` when
        ``timeout_s`` passed first."""
        end = time.monotonic() + timeout_s
        with self._progress:
            while self.queued() > 0 and self._thread.is_alive():
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._flush_wanted = True
                self.wake.set()
                self._progress.wait(min(left, 0.05))
        return self.queued() == 0

    def stop(self, timeout_s: float) -> bool:
        """Sends what is left (waiting up to ``timeout_s`` for GPU events and retries),
        counts the rest as dropped and ends the thread. ``True`` when everything was sent
        or given up in time."""
        if self._stop_deadline is None:
            self._stop_deadline = time.monotonic() + max(0.0, timeout_s)
        self.wake.set()
        self._thread.join(max(0.0, timeout_s) + 1.0)
        return not self._thread.is_alive()

    # ---- the sender thread -------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                now = time.monotonic()
                deadline = self._stop_deadline
                stopping = deadline is not None
                try:
                    self._intake(now, unbounded=stopping)
                    self._resolve(now, force=stopping and now >= deadline)  # type: ignore[operator]
                    self._send(now, deadline)
                except Exception as e:  # never let the thread die on a bug or a bad value
                    self.errors += 1
                    self._warn("internal", f"edgewatch sender step failed: {e!r}")
                if self._flush_wanted and self.queued() == 0:
                    self._flush_wanted = False
                with self._progress:
                    self._progress.notify_all()
                if stopping and (self.queued() == 0 or time.monotonic() >= deadline):  # type: ignore[operator]
                    break
                self.wake.wait(self._wait_s(now))
                self.wake.clear()
        finally:
            left = self.queued()
            self.queue.clear()
            self._pending.clear()
            self._ready = []
            if left:
                self.count_drop(left)
                log.warning("edgewatch: %d points not sent before close were dropped", left)
            self._transport.close()
            with self._progress:
                self._progress.notify_all()

    def _wait_s(self, now: float) -> float:
        wait = self._flush_interval
        if self._ready:
            wait = min(wait, max(0.0, self._last_send + self._flush_interval - now))
        if self._pending:
            wait = min(wait, self._gpu_poll)
        if self._retry_at is not None:
            wait = min(wait, max(0.0, self._retry_at - now))
        if self._stop_deadline is not None:
            wait = min(wait, 0.002)
        return wait

    def _intake(self, now: float, unbounded: bool) -> None:
        queue = self.queue
        while queue:
            if not unbounded and len(self._ready) >= self._batch_points:
                return
            item = queue[0]
            if item[4]:
                if not unbounded and len(self._pending) >= self.capacity:
                    return
                self._pending.append((now, item))
            else:
                self._encode(item, None)
            queue.popleft()

    def _resolve(self, now: float, force: bool) -> None:
        pending = self._pending
        clock = self._clock
        while pending:
            since, item = pending[0]
            spans = item[4] or []
            gpu_ms: Optional[float] = None
            try:
                if clock.ready(spans):
                    gpu_ms = clock.resolve(spans)
                elif not force and now - since < self._gpu_timeout:
                    return  # events complete in order on a stream: look again later
                else:
                    self.gpu_timeouts += 1
                    self._warn("gpu", "edgewatch: GPU events did not complete in time; gpu_ms left out")
            except Exception as e:
                self.errors += 1
                self._warn("gpu", f"edgewatch: reading GPU events failed: {e!r}; gpu_ms left out")
            pending.popleft()
            self._encode(item, gpu_ms)

    def _tag_text(self, tags: TagPairs) -> str:
        text = self._tag_cache.get(tags)
        if text is None:
            merged = dict(self._base_tags)
            merged.update(tags)
            text = _line.encode_tags(merged.items())
            if len(self._tag_cache) < _TAG_CACHE_MAX:
                self._tag_cache[tags] = text
        return text

    def _encode(self, item: Item, gpu_ms: Optional[float]) -> None:
        measurement, tags, fields, ts = item[0], item[1], item[2], item[3]
        if gpu_ms is not None:
            fields["gpu_ms"] = gpu_ms
        tag_text = self._tag_text(tags)
        if len(item) > 5 and item[5] is not None:
            ts = self._encode_gaps(measurement, tag_text, item[5], ts)
        line = _line.encode_line(measurement, tag_text, fields, ts, self._divisor)
        self._encoded += 1
        if self._encoded % _YIELD_EVERY == 0:
            time.sleep(0)  # releases the GIL: a waiting application thread runs now
        if line is None:
            self.count_drop()
            self._warn("empty", f"edgewatch: a {measurement} point had no field to write; dropped")
            return
        self._ready.append(line)

    def _encode_gaps(self, measurement: str, tag_text: str, readings: Tuple[Any, ...], ts: int) -> int:
        """The ``itl_ms`` lines of one ``llm`` request (into the ready lines), their
        timestamps strictly increasing in the written precision (a tie moves one unit
        on); returns the request point's timestamp, moved after the last gap's if needed."""
        times, multi, perf_end = readings
        head = _line.escape_measurement(measurement) + tag_text + " itl_ms="
        divisor = self._divisor
        ready = self._ready
        last = -1
        for count, (at, value) in enumerate(_llm.itl_points(times, multi, perf_end, ts), 1):
            unit = at // divisor
            if unit <= last:
                unit = last + 1
            ready.append(f"{head}{value!r} {unit}")
            last = unit
            if count % _YIELD_GAPS == 0:
                time.sleep(0)  # as in _encode: the application's thread waits no longer
        return ts if ts // divisor > last else (last + 1) * divisor

    def _send(self, now: float, deadline: Optional[float]) -> None:
        if not self._ready:
            return
        due = (
            deadline is not None
            or self._flush_wanted
            or self._retry_at is not None
            or len(self._ready) >= self._batch_points
            or now - self._last_send >= self._flush_interval
        )
        if not due:
            return
        self._last_send = now
        if self._udp:
            self._send_udp()
            return
        if self._retry_at is not None:
            if now < self._retry_at:
                return
            self._retry_at = None
        while self._ready:
            if deadline is not None and time.monotonic() >= deadline:
                return
            if not self._post(self._ready[: self._http_batch]):
                return

    def _send_udp(self) -> None:
        transport = self._transport
        assert isinstance(transport, UdpTransport)
        lines, self._ready = self._ready, []
        for body, count in _line.pack(lines, self._max_datagram):
            if count < 0:
                self.count_drop()
                self._warn("big", f"edgewatch: a line over {self._max_datagram} bytes cannot go in one datagram; dropped")
            elif transport.send(body):
                self.sent += count
            else:
                self.errors += 1
                self.count_drop(count)
                self._warn("udp", f"edgewatch: {transport.last_error}; points dropped")

    def _post(self, batch: List[str]) -> bool:
        """One HTTP attempt for ``batch`` (the head of the ready lines). ``True`` when the
        sender may go on with the next batch, ``False`` when it must wait (backoff)."""
        transport = self._transport
        assert isinstance(transport, HttpTransport)
        count = len(batch)
        answer = transport.send("\n".join(batch).encode("utf-8"))
        decision = decide(answer.status, answer.retry_after, answer.body, count, time.time())
        now = time.monotonic()
        if decision.action == SPLIT:
            self.errors += 1
            self._http_batch = max(1, count // 2)
            self._last_split = now
            return True
        if decision.action == RETRY:
            self.errors += 1
            self._attempt += 1
            if self._first_failure is None:
                self._first_failure = now
            reason = answer.error or decision.reason
            if now - self._first_failure >= self._retry_timeout:
                self._finish(count, dropped=count)
                self._warn("http", f"edgewatch: {reason}; gave up on {count} points after {self._retry_timeout:g} s of retries")
                return True
            delay = decision.delay_s
            if delay is None:
                delay = backoff_delay(self._attempt, *self._backoff, random.random())
            # Never past the retry budget, whatever Retry-After asked for: the last try
            # comes when the budget ends, and if it fails too the batch is given up.
            delay = min(delay, max(0.0, self._first_failure + self._retry_timeout - now))
            self._retry_at = now + delay
            self._warn("http", f"edgewatch: {reason}; retrying in {delay:.2f} s (points are kept)")
            return False
        if decision.action in (SENT, PARTIAL):
            self._regrow(now)
        if decision.action == SENT:
            self._finish(count, dropped=0)
        elif decision.action == PARTIAL:
            self.errors += 1
            self._finish(count, dropped=decision.rejected)
            self._warn("partial", f"edgewatch: the agent refused {decision.rejected} malformed lines: {answer.body[:200]!r}")
        else:
            assert decision.action == DROP
            self.errors += 1
            self._finish(count, dropped=count)
            self._warn("drop", f"edgewatch: {decision.reason}; {count} points dropped")
        return True

    def _regrow(self, now: float) -> None:
        """After an accepted batch: once ``_split_hold_s`` passed since the last 413, the
        HTTP batch size doubles, up to the configured ``batch_points``."""
        if self._http_batch >= self._batch_points:
            return
        if self._last_split is not None and now - self._last_split < self._split_hold_s:
            return
        self._http_batch = min(self._batch_points, self._http_batch * 2)

    def _finish(self, count: int, dropped: int) -> None:
        del self._ready[:count]
        self.sent += count - dropped
        if dropped:
            self.count_drop(dropped)
        self._attempt = 0
        self._first_failure = None
        self._retry_at = None

    def _warn(self, key: str, message: str) -> None:
        """Logs ``message`` at warning, at most once a minute per kind of failure, saying
        how many were not logged in between."""
        now = time.monotonic()
        last, skipped = self._warned.get(key, (-_WARN_EVERY_S, 0))
        if now - last < _WARN_EVERY_S:
            self._warned[key] = (last, skipped + 1)
            return
        suffix = f" ({skipped} more since the last message)" if skipped else ""
        log.warning("%s%s", message, suffix)
        self._warned[key] = (now, 0)
