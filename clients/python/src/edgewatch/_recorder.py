"""``Recorder`` and the ``with rec.infer(...)`` timer: what the application calls.

The hot path (entering and leaving ``infer``, ``stage`` and ``gpu``, and ``record``) reads
two clocks, fills a dict and appends one tuple to the bounded queue (plus, for a call with a
shape or sizes, a dict lookup and a deque append for the ``slow_first_call`` check): no
encoding, no IO, no lock except when a point is dropped or a model meets a new input shape,
and no GPU synchronisation. It never raises because of
the transport; only wrong arguments from the caller raise (``ValueError``/``TypeError`` at
``Recorder(...)``). An exception inside ``infer`` is recorded as ``ok=false`` and re-raised
unchanged.
"""

from __future__ import annotations

import threading
import time
import weakref
from types import TracebackType
from typing import Dict, Hashable, List, Mapping, Optional, Sequence, Tuple, Type, Union

from ._events import EVENT, SEVERITIES, FirstCalls, event_tags
from ._gpu import EventFactory, GpuClock, Span
from ._llm import LLM, Generation, _new_generation
from ._sender import Pipeline, TagPairs
from ._transport import HttpTransport, UdpTransport, parse_url

__all__ = ["Recorder", "Inference", "Stage", "GpuSpan", "Generation"]

_perf_ns = time.perf_counter_ns
_time_ns = time.time_ns

INFERENCE = "inference"

_STAGE_KEYS: Dict[str, str] = {}
_TAG_CACHE_MAX = 1024

# Default send intervals. Over HTTP each request is one acknowledged write, which the
# agent commits and syncs before answering: one fsync and at least one 4 KiB page on the
# device's flash per request, so a request a second rather than ten cuts both its wear
# and its CPU. A UDP datagram costs the agent no commit of its own.
HTTP_FLUSH_S = 1.0
UDP_FLUSH_S = 0.1


def _stage_key(name: str) -> str:
    key = _STAGE_KEYS.get(name)
    if key is None:
        key = name + "_ms"
        if len(_STAGE_KEYS) < 1024:
            _STAGE_KEYS[name] = key
    return key


class Stage:
    """Times one stage of an inference; the time lands in the field ``<name>_ms``
    (summed when the same stage runs more than once)."""

    __slots__ = ("_fields", "_key", "_t0")

    def __init__(self, fields: Dict[str, object], key: str) -> None:
        self._fields = fields
        self._key = key
        self._t0 = 0

    def __enter__(self) -> "Stage":
        self._t0 = _perf_ns()
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        ms = (_perf_ns() - self._t0) / 1e6
        fields = self._fields
        prev = fields.get(self._key)
        fields[self._key] = ms + prev if isinstance(prev, float) else ms


_new_stage = Stage.__new__


class GpuSpan:
    """Records a start and an end event on the current CUDA stream around GPU work; never
    waits for the GPU. Without a GPU clock (no torch, no CUDA) it does nothing."""

    __slots__ = ("_clock", "_spans", "_start")

    def __init__(self, clock: GpuClock, spans: List[Span]) -> None:
        self._clock = clock
        self._spans = spans
        self._start: Optional[object] = None

    def __enter__(self) -> "GpuSpan":
        start = self._clock.event()
        if start is not None:
            start.record()
        self._start = start
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        start = self._start
        if start is None:
            return
        end = self._clock.event()
        if end is None:
            return
        end.record()
        self._spans.append((start, end))  # type: ignore[arg-type]


class Inference:
    """One ``inference`` point being timed: returned by :meth:`Recorder.infer`.

    ``wall_ms`` runs from entering to leaving the ``with`` block; ``stage(name)`` adds
    ``<name>_ms``; ``gpu()`` adds ``gpu_ms`` (from CUDA events, when torch and CUDA are
    there); :meth:`set` adds any other field (``queue_ms=...``). ``ok`` is ``False`` when
    the block raised; the exception propagates unchanged."""

    __slots__ = ("_rec", "_tags", "fields", "_spans", "_t0", "_done", "_key")

    def __init__(self, rec: "Recorder", tags: TagPairs, fields: Dict[str, object]) -> None:
        self._rec = rec
        self._tags = tags
        self.fields = fields
        self._spans: List[Span] = []
        self._t0 = 0
        self._done = False
        self._key: Optional[Hashable] = None

    def __enter__(self) -> "Inference":
        self._t0 = _perf_ns()
        return self

    def stage(self, name: str) -> Stage:
        """Times a stage: ``with t.stage("preprocess"):`` adds ``preprocess_ms``."""
        # Built without calling __init__: one Python frame less on the hot path.
        stage = _new_stage(Stage)
        stage._fields = self.fields
        key = _STAGE_KEYS.get(name)
        stage._key = key if key is not None else _stage_key(name)
        return stage

    def gpu(self) -> GpuSpan:
        """Times GPU work with CUDA events on the current stream, without synchronising:
        the sender thread reads the time once the events complete. ``gpu_ms`` is absent
        without torch or CUDA."""
        return GpuSpan(self._rec._clock, self._spans)

    def set(self, **fields: object) -> "Inference":
        """Adds fields to the point (``t.set(queue_ms=2.1)``); keep each field's type the
        same across points (the agent refuses a type change)."""
        self.fields.update(fields)
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if self._done:
            return
        self._done = True
        fields = self.fields
        wall_ms = fields["wall_ms"] = (_perf_ns() - self._t0) / 1e6
        fields["ok"] = exc_type is None
        rec = self._rec
        queue = rec._queue
        ts = _time_ns()
        first_calls = rec._first_calls
        if first_calls is not None and self._key is not None and exc_type is None:
            first_calls.observe(self._tags, self._key, wall_ms, ts)
        # Recorder._submit, inlined: one Python frame less on the hot path.
        if rec._closed or len(queue) >= rec._capacity:
            rec._pipeline.count_drop()
            return
        queue.append((INFERENCE, self._tags, fields, ts, self._spans or None))
        if len(queue) >= rec._wake_at and not rec._wake.is_set():
            rec._wake.set()


_new_inference = Inference.__new__


def _tag_pairs(
    model: str,
    model_version: Optional[str],
    stage: Optional[str],
    tags: Optional[Mapping[str, str]],
) -> TagPairs:
    pairs: List[Tuple[str, str]] = [("model", str(model))]
    if model_version is not None:
        pairs.append(("model_version", str(model_version)))
    if stage is not None:
        pairs.append(("stage", str(stage)))
    if tags:
        pairs.extend((str(k), str(v)) for k, v in tags.items())
    return tuple(pairs)


class Recorder:
    """Sends ``inference`` points to an edgewatch agent from a bounded in-memory queue by
    one background thread.

    ``url`` is ``udp://HOST:PORT`` (fire-and-forget datagrams, the agent's ``[udp]``
    input; its ``precision`` must match, ``ns`` by default) or ``http://HOST:PORT`` /
    ``https://...`` (the agent's ``/write``; ``token`` is sent as ``Authorization: Token``).
    ``app`` and ``tags`` are added to every point.

    The sender sends at most once every ``flush_interval`` seconds (1.0 over HTTP, where
    each request is a synced commit on the device; 0.1 over UDP), sooner when a batch is
    full, on :meth:`flush` and on :meth:`close`.

    Nothing the agent or the network does raises into the application: points that find
    the queue full are dropped and counted, failed sends are counted (HTTP retries with
    backoff for up to ``retry_timeout`` seconds and honours ``503 Retry-After`` within
    that budget; a ``413`` halves the batch for a while), see
    :meth:`stats`. :meth:`close` (also run at interpreter exit) sends what is left.

    ``first_call_ratio`` (5), ``first_call_min_ms`` (20) and ``first_call_shapes`` (256):
    an ``infer`` call on an input shape the model had not seen that takes more than
    ``first_call_ratio`` times the model's steady median and more than
    ``first_call_min_ms`` is also recorded as a ``slow_first_call`` event; each model
    remembers at most ``first_call_shapes`` shapes. ``first_call_ratio=None`` turns it off.
    """

    def __init__(
        self,
        url: str = "udp://127.0.0.1:8089",
        *,
        app: Optional[str] = None,
        tags: Optional[Mapping[str, str]] = None,
        token: Optional[str] = None,
        queue_size: int = 10_000,
        batch_points: int = 1_000,
        max_datagram_bytes: int = 60_000,
        flush_interval: Optional[float] = None,
        timeout: float = 5.0,
        retry_timeout: float = 60.0,
        backoff: Tuple[float, float] = (0.1, 5.0),
        precision: str = "ns",
        gpu: bool = True,
        gpu_events: Optional[EventFactory] = None,
        gpu_poll_interval: float = 0.005,
        gpu_timeout: float = 10.0,
        first_call_ratio: Optional[float] = 5.0,
        first_call_min_ms: float = 20.0,
        first_call_shapes: int = 256,
    ) -> None:
        endpoint = parse_url(url)
        if not 512 <= max_datagram_bytes <= 65_507:
            raise ValueError("max_datagram_bytes must be between 512 and 65507 (one UDP datagram)")
        if endpoint.scheme == "udp":
            if token:
                raise ValueError("a token needs an http:// or https:// address: UDP carries no credential")
            transport: Union[UdpTransport, HttpTransport] = UdpTransport(endpoint, timeout)
        else:
            transport = HttpTransport(endpoint, token, timeout, precision)
        if flush_interval is None:
            flush_interval = HTTP_FLUSH_S if isinstance(transport, HttpTransport) else UDP_FLUSH_S
        if not flush_interval > 0:
            raise ValueError("flush_interval must be above 0 seconds")
        base_tags: Dict[str, str] = {str(k): str(v) for k, v in (tags or {}).items()}
        if app is not None:
            base_tags["app"] = str(app)
        self.url = url
        self._clock = GpuClock(gpu_events, enabled=gpu)
        self._pipeline = Pipeline(
            transport,
            capacity=queue_size,
            batch_points=batch_points,
            max_datagram_bytes=max_datagram_bytes,
            flush_interval_s=flush_interval,
            gpu_poll_s=gpu_poll_interval,
            gpu_timeout_s=gpu_timeout,
            retry_timeout_s=retry_timeout,
            backoff_base_s=backoff[0],
            backoff_max_s=backoff[1],
            precision=precision,
            base_tags=base_tags,
            clock=self._clock,
        )
        # Bound once: the hot path reads these without attribute chains.
        self._queue = self._pipeline.queue
        self._capacity = self._pipeline.capacity
        self._wake = self._pipeline.wake
        self._wake_at = self._pipeline.wake_at
        self._tag_cache: Dict[Tuple[str, Optional[str], Optional[str]], TagPairs] = {}
        self._llm_tag_cache: Dict[Tuple[str, Optional[str], Optional[str], Optional[str]], TagPairs] = {}
        self._closed = False
        self._close_lock = threading.Lock()
        self._first_calls: Optional[FirstCalls] = (
            FirstCalls(self, first_call_ratio, first_call_min_ms, first_call_shapes)
            if first_call_ratio
            else None
        )
        # At interpreter exit (or if the recorder is dropped unclosed) what is queued is
        # still sent: the sender thread is a daemon and would otherwise die with it.
        self._finalizer = weakref.finalize(self, self._pipeline.stop, timeout)

    # ---- recording ----------------------------------------------------------------------

    def infer(
        self,
        model: str,
        *,
        batch_size: Optional[int] = None,
        input_length: Optional[int] = None,
        model_version: Optional[str] = None,
        stage: Optional[str] = None,
        tags: Optional[Mapping[str, str]] = None,
        queue_ms: Optional[float] = None,
        shape: Optional[Union[Sequence[int], str]] = None,
    ) -> Inference:
        """Times one inference of ``model``: ``with rec.infer("yolov8n", batch_size=4) as t:``.
        The point is sent when the block ends (after its GPU events complete).

        ``shape`` (``x.shape``, or any string naming the input's kind) is what makes a call
        a first call for the ``slow_first_call`` event; without it, ``batch_size`` and
        ``input_length`` do, and without those no call is checked. It is not sent."""
        fields: Dict[str, object] = {}
        first: Optional[Hashable] = None
        if batch_size is not None:
            fields["batch_size"] = int(batch_size)
        if input_length is not None:
            fields["input_length"] = int(input_length)
        if shape is not None:
            first = shape if isinstance(shape, (tuple, str)) else tuple(shape)
        elif batch_size is not None or input_length is not None:
            first = ("sizes", batch_size, input_length)
        if queue_ms is not None:
            fields["queue_ms"] = float(queue_ms)
        if tags:
            pairs = _tag_pairs(model, model_version, stage, tags)
        else:
            key = (model, model_version, stage)
            pairs = self._tag_cache.get(key)  # type: ignore[assignment]
            if pairs is None:
                pairs = _tag_pairs(model, model_version, stage, None)
                if len(self._tag_cache) < _TAG_CACHE_MAX:
                    self._tag_cache[key] = pairs
        inf = _new_inference(Inference)
        inf._rec = self
        inf._tags = pairs
        inf.fields = fields
        inf._spans = []
        inf._t0 = 0
        inf._done = False
        inf._key = first
        return inf

    def generate(
        self,
        model: str,
        prompt_tokens: Optional[int] = None,
        *,
        server: Optional[str] = None,
        model_version: Optional[str] = None,
        stage: Optional[str] = None,
        tags: Optional[Mapping[str, str]] = None,
        queue_ms: Optional[float] = None,
    ) -> Generation:
        """Times one LLM request of ``model`` as an ``llm`` point: ``with
        rec.generate("llama-3-8b", prompt_tokens=41, server="vllm") as g:`` then
        ``g.token()`` as each token (or chunk: ``g.token(n)``) arrives. The points are
        sent when the block ends."""
        fields: Dict[str, object] = {}
        if prompt_tokens is not None:
            fields["prompt_tokens"] = int(prompt_tokens)
        if queue_ms is not None:
            fields["queue_ms"] = float(queue_ms)
        extra: Optional[Dict[str, str]] = None
        if server is not None or tags:
            extra = {"server": str(server)} if server is not None else {}
            if tags:
                extra.update(tags)
        key = (model, model_version, stage, server)
        pairs = None if tags else self._llm_tag_cache.get(key)
        if pairs is None:
            pairs = _tag_pairs(model, model_version, stage, extra)
            if not tags and len(self._llm_tag_cache) < _TAG_CACHE_MAX:
                self._llm_tag_cache[key] = pairs
        gen = _new_generation(Generation)
        gen._rec = self
        gen._tags = pairs
        gen.fields = fields
        gen._t0 = 0
        gen._times = []
        gen._multi = []
        gen._end = 0
        gen._n_at_end = -1
        gen._reported = None
        gen._failed = False
        gen._exited = False
        return gen

    def record(
        self,
        model: str,
        *,
        wall_ms: Optional[float] = None,
        gpu_ms: Optional[float] = None,
        queue_ms: Optional[float] = None,
        batch_size: Optional[int] = None,
        input_length: Optional[int] = None,
        ok: Optional[bool] = None,
        model_version: Optional[str] = None,
        stage: Optional[str] = None,
        stages: Optional[Mapping[str, float]] = None,
        tags: Optional[Mapping[str, str]] = None,
        fields: Optional[Mapping[str, object]] = None,
        timestamp_ns: Optional[int] = None,
    ) -> bool:
        """Records one inference measured by the caller. ``stages`` maps stage names to
        milliseconds (``{"preprocess": 3.1}`` -> ``preprocess_ms``). Returns ``False`` when
        the point was dropped (queue full or recorder closed)."""
        values: Dict[str, object] = {}
        if wall_ms is not None:
            values["wall_ms"] = float(wall_ms)
        if gpu_ms is not None:
            values["gpu_ms"] = float(gpu_ms)
        if queue_ms is not None:
            values["queue_ms"] = float(queue_ms)
        if batch_size is not None:
            values["batch_size"] = int(batch_size)
        if input_length is not None:
            values["input_length"] = int(input_length)
        if ok is not None:
            values["ok"] = bool(ok)
        if stages:
            for name, ms in stages.items():
                values[_stage_key(name)] = float(ms)
        if fields:
            values.update(fields)
        ts = _time_ns() if timestamp_ns is None else int(timestamp_ns)
        return self._submit(
            INFERENCE, _tag_pairs(model, model_version, stage, tags), values, ts, None
        )

    def write(
        self,
        measurement: str,
        fields: Mapping[str, object],
        *,
        tags: Optional[Mapping[str, str]] = None,
        timestamp_ns: Optional[int] = None,
    ) -> bool:
        """Records a point of any measurement (the recorder's ``app`` and ``tags`` are
        added). Returns ``False`` when it was dropped."""
        pairs = tuple((str(k), str(v)) for k, v in (tags or {}).items())
        ts = _time_ns() if timestamp_ns is None else int(timestamp_ns)
        return self._submit(measurement, pairs, dict(fields), ts, None)

    def event(
        self,
        kind: str,
        message: str,
        *,
        severity: str = "info",
        tags: Optional[Mapping[str, str]] = None,
        timestamp_ns: Optional[int] = None,
        **fields: object,
    ) -> bool:
        """Records one ``edgewatch_event`` point, in the agent's own events' shape: tags
        ``kind``, ``severity`` (``info``, ``warning`` or ``critical``), ``source=python``
        (and ``tags``, the recorder's ``app`` and tags), fields ``message`` (one sentence a
        person reads) and the keyword ``fields`` (details: keep each one's type the same).
        Returns ``False`` when it was dropped."""
        if severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, not {severity!r}")
        values: Dict[str, object] = {"message": str(message)}
        values.update(fields)
        pairs = event_tags(str(kind), severity, dict(tags) if tags else None)
        ts = _time_ns() if timestamp_ns is None else int(timestamp_ns)
        return self._submit(EVENT, pairs, values, ts, None)

    def _submit(
        self,
        measurement: str,
        tags: TagPairs,
        fields: Dict[str, object],
        ts: int,
        spans: Optional[List[Span]],
    ) -> bool:
        queue = self._queue
        if self._closed or len(queue) >= self._capacity:
            self._pipeline.count_drop()
            return False
        queue.append((measurement, tags, fields, ts, spans))
        if len(queue) >= self._wake_at and not self._wake.is_set():
            self._wake.set()
        return True

    def _submit_llm(
        self,
        tags: TagPairs,
        fields: Dict[str, object],
        ts: int,
        readings: Optional[Tuple[object, ...]],
        points: int,
    ) -> bool:
        """One ``llm`` request: its point and, from ``readings``, its ``points - 1``
        ``itl_ms`` points, as one queue item (dropped and counted together)."""
        queue = self._queue
        if self._closed or len(queue) >= self._capacity:
            self._pipeline.count_drop(points)
            return False
        queue.append((LLM, tags, fields, ts, None, readings))
        if len(queue) >= self._wake_at and not self._wake.is_set():
            self._wake.set()
        return True

    # ---- state and lifecycle -------------------------------------------------------------

    def stats(self) -> Dict[str, int]:
        """``sent`` (points the agent stored, or UDP datagrams' points handed to the
        kernel), ``dropped`` (points given up: queue full, refused by the agent, retries
        exhausted, left at close), ``errors`` (failed send attempts), ``queued`` (points
        waiting: in the queue, on GPU events, or being sent), ``gpu_timeouts`` (points sent
        without ``gpu_ms`` because their events did not complete in time)."""
        p = self._pipeline
        return {
            "sent": p.sent,
            "dropped": p.dropped,
            "errors": p.errors,
            "queued": p.queued(),
            "gpu_timeouts": p.gpu_timeouts,
        }

    def flush(self, timeout: float = 5.0) -> bool:
        """Waits until everything recorded so far is sent or given up; ``False`` when
        ``timeout`` seconds passed first (e.g. the agent is down and retries go on)."""
        if self._closed:
            return self._pipeline.queued() == 0
        return self._pipeline.flush(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Sends what is queued (waiting up to ``timeout`` seconds), then stops the sender.
        Points recorded afterwards are dropped and counted. Safe to call twice; also runs
        at interpreter exit."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._finalizer.detach()
        self._pipeline.stop(timeout)

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "Recorder":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Recorder({self.url!r}, closed={self._closed})"
