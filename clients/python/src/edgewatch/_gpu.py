"""GPU time from device events: start and end events recorded on the current stream around
the GPU work, resolved later by the sender thread.

The application's thread only *records* events (an asynchronous enqueue on the stream). It
never calls ``synchronize``, ``query`` or ``elapsed_time``: those happen on the sender
thread, once ``query()`` says the end event has completed. Without torch, or with torch but
no CUDA device, there is no clock and ``gpu_ms`` is simply absent. torch is never imported
here: the clock is found only when the application has imported torch itself.
"""

from __future__ import annotations

import sys
from collections import deque
from typing import Callable, Deque, List, Optional, Protocol, Tuple


class GpuEvent(Protocol):
    """The part of ``torch.cuda.Event``'s API the client uses."""

    def record(self) -> None:
        """Enqueues the event on the current stream (asynchronous)."""

    def query(self) -> bool:
        """Whether the work before the event has completed (non-blocking)."""

    def elapsed_time(self, end_event: "GpuEvent") -> float:
        """Milliseconds from this event to ``end_event``; both must have completed."""


EventFactory = Callable[[], GpuEvent]
"""Makes one timing-enabled event (``lambda: torch.cuda.Event(enable_timing=True)``)."""

Span = Tuple[GpuEvent, GpuEvent]

_POOL_MAX = 512


def _torch_factory() -> Optional[EventFactory]:
    """A CUDA event factory when the application has imported torch and CUDA is there."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        event = torch.cuda.Event
    except Exception:  # a broken or partial torch install: no GPU time, never an error
        return None

    def make() -> GpuEvent:
        return event(enable_timing=True)  # type: ignore[no-any-return]

    return make


class GpuClock:
    """Hands out events (reusing resolved ones) to the hot path; resolves spans on the
    sender thread."""

    def __init__(self, factory: Optional[EventFactory], enabled: bool = True) -> None:
        self._factory = factory if enabled else None
        self._searching = enabled and factory is None
        self._enabled = enabled
        self._pool: Deque[GpuEvent] = deque()

    def event(self) -> Optional[GpuEvent]:
        """An event to record, or ``None`` when there is no GPU clock. Hot path."""
        factory = self._factory
        if factory is None:
            if not self._searching or "torch" not in sys.modules:
                return None
            # torch is imported: decide once whether CUDA is there.
            self._searching = False
            factory = self._factory = _torch_factory()
            if factory is None:
                return None
        try:
            return self._pool.pop()
        except IndexError:
            return factory()

    @property
    def enabled(self) -> bool:
        return self._enabled

    @staticmethod
    def ready(spans: List[Span]) -> bool:
        """Whether every span's events have completed (``query()``; sender thread)."""
        for start, end in spans:
            if not end.query() or not start.query():
                return False
        return True

    def resolve(self, spans: List[Span]) -> float:
        """Total milliseconds of completed spans; their events go back to the pool."""
        total = 0.0
        for start, end in spans:
            total += float(start.elapsed_time(end))
        self.release(spans)
        return total

    def release(self, spans: List[Span]) -> None:
        """Returns completed events, whose timing is read, for reuse."""
        pool = self._pool
        for start, end in spans:
            if len(pool) < _POOL_MAX:
                pool.append(start)
                pool.append(end)
