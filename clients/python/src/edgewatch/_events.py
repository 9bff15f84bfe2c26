"""Events from the application: points of the measurement ``edgewatch_event`` in the agent's
shape (tags ``kind``, ``severity``, ``source=python``; fields ``message``, one human
sentence, and one field per detail), and the ``slow_first_call`` detector.

``FirstCalls`` keeps, per model (per tag set of ``rec.infer``), the input shapes already
seen (at most ``max_shapes``, the oldest seen forgotten first) and the wall times of the
last ``WINDOW`` calls on a seen shape, whose median is the steady state. A call on a
never-seen shape that took more than ``ratio`` times that median and more than ``min_ms``
becomes one ``slow_first_call`` event. Calls on new shapes made before the model has
``MIN_STEADY`` steady calls (the very first call, a warm-up over several shapes) wait, at
most ``MAX_PENDING`` of them, and are judged once it has. A call on a seen shape costs a
dict lookup and a list store on the application's thread; the median is computed only for
a new shape, and only when the steady times changed since the last one.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING, Dict, Hashable, List, Optional, Tuple

if TYPE_CHECKING:  # pragma: no cover
    from ._recorder import Recorder
    from ._sender import TagPairs

EVENT = "edgewatch_event"
SEVERITIES = ("info", "warning", "critical")

WINDOW = 32
MIN_STEADY = 5
MAX_PENDING = 8
MAX_MODELS = 256


def event_tags(kind: str, severity: str, tags: Optional[Dict[str, str]] = None) -> "TagPairs":
    """The tag pairs of an event point from Python."""
    pairs: List[Tuple[str, str]] = [("kind", kind), ("severity", severity), ("source", "python")]
    if tags:
        pairs.extend((str(k), str(v)) for k, v in tags.items())
    return tuple(pairs)


def shape_text(key: Hashable) -> str:
    """``8x3x224x224`` for a shape, ``batch_size=4,input_length=640`` for ``infer``'s sizes."""
    if isinstance(key, str):
        return key
    if isinstance(key, tuple) and len(key) == 3 and key[0] == "sizes":
        parts = []
        if key[1] is not None:
            parts.append(f"batch_size={key[1]}")
        if key[2] is not None:
            parts.append(f"input_length={key[2]}")
        return ",".join(parts)
    if isinstance(key, tuple):
        return "x".join(str(d) for d in key)
    return str(key)


class _Model:
    __slots__ = ("shapes", "times", "median", "pending")

    def __init__(self) -> None:
        self.shapes: Dict[Hashable, None] = {}
        self.times: "deque[float]" = deque(maxlen=WINDOW)
        self.median: Optional[float] = None  # None: times changed since it was computed
        self.pending: List[Tuple[Hashable, float, int]] = []


class FirstCalls:
    """The ``slow_first_call`` detector of one recorder (see the module doc)."""

    def __init__(self, rec: "Recorder", ratio: float, min_ms: float, max_shapes: int) -> None:
        if ratio <= 1.0:
            raise ValueError("first_call_ratio must be above 1 (or None to turn the check off)")
        if min_ms < 0:
            raise ValueError("first_call_min_ms must not be negative")
        if max_shapes < 1:
            raise ValueError("first_call_shapes must be at least 1")
        self._rec = rec
        self.ratio = float(ratio)
        self.min_ms = float(min_ms)
        self.max_shapes = int(max_shapes)
        self._models: Dict["TagPairs", _Model] = {}
        self._lock = threading.Lock()
        self._tags = event_tags("slow_first_call", "warning")

    def observe(self, tags: "TagPairs", key: Hashable, wall_ms: float, ts: int) -> None:
        """One finished call of the model ``tags`` on input ``key``. Hot path; never raises."""
        try:
            m = self._models.get(tags)
            if m is None:
                m = self._add(tags)
                if m is None:
                    return
            if key in m.shapes:
                m.times.append(wall_ms)
                m.median = None
                if m.pending and len(m.times) >= MIN_STEADY:
                    self._judge_pending(tags, m)
                return
            self._new_shape(tags, m, key, wall_ms, ts)
        except Exception:  # never into the application
            return

    def _add(self, tags: "TagPairs") -> Optional[_Model]:
        with self._lock:
            m = self._models.get(tags)
            if m is None and len(self._models) < MAX_MODELS:
                m = self._models[tags] = _Model()
            return m

    def _new_shape(self, tags: "TagPairs", m: _Model, key: Hashable, wall_ms: float, ts: int) -> None:
        with self._lock:
            shapes = m.shapes
            if key in shapes:
                return
            while len(shapes) >= self.max_shapes:
                del shapes[next(iter(shapes))]
            shapes[key] = None
            if len(m.times) >= MIN_STEADY:
                self._judge(tags, m, key, wall_ms, ts)
            else:
                if len(m.pending) >= MAX_PENDING:
                    del m.pending[0]
                m.pending.append((key, wall_ms, ts))

    def _judge_pending(self, tags: "TagPairs", m: _Model) -> None:
        with self._lock:
            pending, m.pending = m.pending, []
            for key, wall_ms, ts in pending:
                self._judge(tags, m, key, wall_ms, ts)

    def _steady(self, m: _Model) -> float:
        median = m.median
        if median is None:
            ordered = sorted(m.times)
            n = len(ordered)
            median = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
            m.median = median
        return median

    def _judge(self, tags: "TagPairs", m: _Model, key: Hashable, wall_ms: float, ts: int) -> None:
        if wall_ms <= self.min_ms:
            return
        steady = self._steady(m)
        if wall_ms <= self.ratio * steady:
            return
        model = tags[0][1]
        shape = shape_text(key)
        ratio = wall_ms / steady if steady > 0 else float(wall_ms)
        message = (
            f"{model}: the first call on input {shape} took {wall_ms:.1f} ms, "
            f"{ratio:.0f} times the steady {steady:.3g} ms (warm-up, autotuning or a compile)"
        )
        fields: Dict[str, object] = {
            "message": message,
            "model": model,
            "shape": shape,
            "wall_ms": float(wall_ms),
            "steady_ms": float(steady),
            "ratio": float(ratio),
        }
        self._rec._submit(EVENT, self._tags, fields, ts, None)
