"""PyTorch integration: ``instrument(module, rec, model=...)`` makes every forward call of
``module`` one ``inference`` point, with forward pre-hooks and hooks (no change to the
module's code).

Each call records ``wall_ms``, ``ok``, ``batch_size`` and ``input_length`` (from the first
tensor argument's shape) and, when torch runs on CUDA, ``gpu_ms`` from CUDA events recorded
on the current stream, read later by the sender thread: the hooks never synchronise.
``per_module=True`` (opt-in) also times the direct children, or the named submodules you
list, on one forward call in ``sample_every``, as ``inference_module`` points tagged
``module`` (kept out of the ``inference`` measurement so that per-model latency and
throughput stay per call).

Each call also passes its input's shape to ``rec.infer``, so a first call on a new shape
that is far slower than the steady state becomes a ``slow_first_call`` event (see
``Recorder``), and, once ``torch._dynamo`` is loaded (``torch.compile``), a
:class:`RecompileWatch` checks after each call whether dynamo compiled again: each
recompilation becomes one ``recompile`` event (``edgewatch_event``, severity ``warning``)
with the reason dynamo gives. Instrument the module ``torch.compile`` returned, not the
one inside it: hooks inside a compiled module are traced by dynamo.

torch is never imported here: the hooks are registered through the module you pass, and
dynamo's counters are read only once the application has loaded it. An exception inside
``forward`` is recorded as ``ok=false`` (on torch >= 2.0, whose ``always_call`` hooks run
on an exception) and propagates unchanged.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from ._events import EVENT, event_tags
from ._recorder import GpuSpan, Inference, Recorder

Sizes = Callable[[Tuple[Any, ...], Mapping[str, Any]], Tuple[Optional[int], Optional[int]]]

__all__ = ["instrument", "Instrumented", "input_sizes", "RecompileWatch", "MODULE_MEASUREMENT"]

MODULE_MEASUREMENT = "inference_module"


def _first_shape(args: Iterable[Any]) -> Optional[Tuple[int, ...]]:
    for value in args:
        shape = getattr(value, "shape", None)
        if shape is not None:
            # torch.Size is a tuple of ints already; numpy's shape too.
            return shape if isinstance(shape, tuple) else tuple(int(d) for d in shape)
        if isinstance(value, (list, tuple)):
            inner = _first_shape(value)
            if inner is not None:
                return inner
    return None


def input_sizes(
    args: Tuple[Any, ...], kwargs: Mapping[str, Any]
) -> Tuple[Optional[int], Optional[int]]:
    """``(batch_size, input_length)`` from the first tensor argument: its first dimension,
    and its last when it has two or more (sequence length, image width)."""
    return _sizes_of(_input_shape(args, kwargs))


def _input_shape(args: Tuple[Any, ...], kwargs: Mapping[str, Any]) -> Optional[Tuple[int, ...]]:
    shape = _first_shape(args)
    if shape is None and kwargs:
        shape = _first_shape(kwargs.values())
    return shape


def _sizes_of(shape: Optional[Tuple[int, ...]]) -> Tuple[Optional[int], Optional[int]]:
    if not shape:
        return None, None
    return int(shape[0]), (int(shape[-1]) if len(shape) >= 2 else None)


def _raised(result: Any) -> bool:
    # An always_call forward hook runs inside torch's `except` block when forward raised:
    # then there is no result and the exception is the one being handled.
    return result is None and sys.exc_info()[0] is not None


class Instrumented:
    """The hooks ``instrument`` registered; ``remove()`` takes them all off."""

    def __init__(self) -> None:
        self.handles: List[Any] = []

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


def _register_forward_hook(module: Any, hook: Callable[..., Any]) -> Any:
    try:
        return module.register_forward_hook(hook, always_call=True)
    except TypeError:  # torch < 2.0: no always_call; an exception then records nothing
        return module.register_forward_hook(hook)


def instrument(
    module: Any,
    rec: Recorder,
    model: str,
    *,
    model_version: Optional[str] = None,
    stage: Optional[str] = None,
    tags: Optional[Mapping[str, str]] = None,
    per_module: Union[bool, Iterable[str]] = False,
    sample_every: int = 100,
    sizes: Optional[Sizes] = None,
    recompiles: Union[bool, "RecompileWatch"] = True,
) -> Instrumented:
    """Records each ``module(...)`` call as an ``inference`` point of ``model``.

    ``per_module``: ``True`` times the direct children, a list of names (as in
    ``module.named_modules()``) times those; one call in ``sample_every`` is timed so that
    the hooks cost nothing on the others. ``sizes(args, kwargs)`` overrides how batch size
    and input length are read (default: :func:`input_sizes`). ``recompiles``: after each
    call, record dynamo's recompilations as ``recompile`` events (``False``: don't; or a
    :class:`RecompileWatch` to share)."""
    if sample_every < 1:
        raise ValueError("sample_every must be at least 1")
    read_sizes: Optional[Sizes] = sizes
    watch: Optional[RecompileWatch] = None
    if isinstance(recompiles, RecompileWatch):
        watch = recompiles
    elif recompiles:
        watch = RecompileWatch(rec)
    local = threading.local()
    done = Instrumented()
    extra_tags = dict(tags) if tags else None
    counter = [0]

    def stack() -> List[Tuple[Inference, GpuSpan]]:
        s: Optional[List[Tuple[Inference, GpuSpan]]] = getattr(local, "stack", None)
        if s is None:
            s = local.stack = []
        return s

    def pre_hook(_mod: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        try:
            shape = _input_shape(args, kwargs)
            batch, length = _sizes_of(shape) if read_sizes is None else read_sizes(args, kwargs)
        except Exception:
            shape, batch, length = None, None, None
        inf = rec.infer(
            model,
            batch_size=batch,
            input_length=length,
            model_version=model_version,
            stage=stage,
            tags=extra_tags,
            shape=shape,
        )
        counter[0] += 1
        local.sampling = bool(per_module) and counter[0] % sample_every == 0
        inf.__enter__()
        span = inf.gpu()
        span.__enter__()
        stack().append((inf, span))

    def hook(_mod: Any, _args: Tuple[Any, ...], result: Any) -> None:
        s = stack()
        if not s:
            return
        inf, span = s.pop()
        local.sampling = False
        span.__exit__(None, None, None)
        if _raised(result):
            exc_type, exc, tb = sys.exc_info()
            inf.__exit__(exc_type, exc, tb)
        else:
            inf.__exit__(None, None, None)
        if watch is not None:
            watch.check(model)

    try:
        pre = module.register_forward_pre_hook(pre_hook, with_kwargs=True)
    except TypeError:  # torch < 2.0: no keyword arguments for hooks
        pre = module.register_forward_pre_hook(lambda m, a: pre_hook(m, a, {}))
    done.handles.append(pre)
    done.handles.append(_register_forward_hook(module, hook))

    if per_module:
        if per_module is True:
            targets = list(module.named_children())
        else:
            wanted = set(per_module)
            targets = [(n, m) for n, m in module.named_modules() if n in wanted]
            missing = wanted - {n for n, _ in targets}
            if missing:
                raise ValueError(f"no submodule named {sorted(missing)} in {type(module).__name__}")
        for name, child in targets:
            _instrument_child(child, name, rec, model, model_version, extra_tags, local, done)
    return done


def _instrument_child(
    child: Any,
    name: str,
    rec: Recorder,
    model: str,
    model_version: Optional[str],
    tags: Optional[Mapping[str, str]],
    local: threading.local,
    done: Instrumented,
) -> None:
    point_tags: List[Tuple[str, str]] = [("model", model), ("module", name)]
    if model_version is not None:
        point_tags.append(("model_version", model_version))
    if tags:
        point_tags.extend(tags.items())
    tag_pairs = tuple(point_tags)
    key = f"_edgewatch_{id(child)}"

    def pre_hook(_mod: Any, _args: Tuple[Any, ...]) -> None:
        if not getattr(local, "sampling", False):
            return
        spans: List[Any] = []
        span = GpuSpan(rec._clock, spans)
        span.__enter__()
        frames = getattr(local, key, None)
        if frames is None:
            frames = []
            setattr(local, key, frames)
        frames.append((time.perf_counter_ns(), span, spans))

    def hook(_mod: Any, _args: Tuple[Any, ...], result: Any) -> None:
        frames = getattr(local, key, None)
        if not frames:
            return
        t0, span, spans = frames.pop()
        span.__exit__(None, None, None)
        fields: Dict[str, object] = {
            "wall_ms": (time.perf_counter_ns() - t0) / 1e6,
            "ok": not _raised(result),
        }
        rec._submit(MODULE_MEASUREMENT, tag_pairs, fields, time.time_ns(), spans or None)

    done.handles.append(child.register_forward_pre_hook(pre_hook))
    done.handles.append(_register_forward_hook(child, hook))


class RecompileWatch:
    """Turns dynamo's recompilations into ``recompile`` events of ``rec``.

    ``check(model)`` compares dynamo's frame counter (``torch._dynamo.utils.counters``) with
    its value at the last check, a couple of dict lookups; when it moved, it reads the
    compilations dynamo recorded since (``get_compilation_metrics()``) and records one event
    per recompilation (a compile of code already compiled: ``recompile_reason`` set, or a
    cache entry there before), with fields ``model``, ``reason``, ``compile_id``, ``frame``
    (the compiled function), ``compile_ms``, ``graphs`` (graphs dynamo compiled in this
    process) and ``recompiles`` (recompilations this watch gave to ``model``); ``error`` when
    dynamo gave up (its recompile limit). Call it right after each call of a compiled model:
    dynamo's counters are process-wide, so a compile is given to the model checked next.
    Nothing is read until the application has loaded ``torch._dynamo``; compilations from
    before that (or before the watch) are not reported. Never raises."""

    def __init__(self, rec: Recorder) -> None:
        self._rec = rec
        self._lock = threading.Lock()
        self._utils: Any = None
        self._frames = 0
        self._last_end_us = -1
        self._counts: Dict[str, int] = {}
        self._tags = event_tags("recompile", "warning")
        self._bind()

    def _bind(self) -> None:
        utils = sys.modules.get("torch._dynamo.utils")
        if utils is None:
            return
        try:
            with self._lock:
                if self._utils is None:
                    self._frames = self._frame_count(utils)
                    for m in self._metrics(utils):
                        end = getattr(m, "end_time_us", None) or 0
                        self._last_end_us = max(self._last_end_us, end)
                    self._utils = utils
        except Exception:  # a dynamo without these counters: nothing to watch
            return

    @staticmethod
    def _frame_count(utils: Any) -> int:
        frames = utils.counters.get("frames")
        return int(frames.get("total", 0)) if frames is not None else 0

    @staticmethod
    def _metrics(utils: Any) -> List[Any]:
        get = getattr(utils, "get_compilation_metrics", None)
        return list(get()) if get is not None else []

    def check(self, model: str) -> int:
        """Records the recompilations since the last check as events of ``model``; returns
        how many. Cheap when dynamo compiled nothing."""
        utils = self._utils
        if utils is None:
            self._bind()
            return 0
        try:
            frames = utils.counters.get("frames")
            total = frames.get("total", 0) if frames is not None else 0
            if total == self._frames:
                return 0
            return self._scan(utils, model, int(total))
        except Exception:  # never into the application
            return 0

    def _scan(self, utils: Any, model: str, total: int) -> int:
        with self._lock:
            if total == self._frames:
                return 0
            self._frames = total
            fresh = []
            for m in self._metrics(utils):
                end = getattr(m, "end_time_us", None) or 0
                if end > self._last_end_us:
                    fresh.append(m)
            for m in fresh:
                self._last_end_us = max(self._last_end_us, getattr(m, "end_time_us", None) or 0)
            stats = utils.counters.get("stats")
            graphs = int(stats.get("unique_graphs", 0)) if stats is not None else 0
            sent = 0
            for m in fresh:
                reason = getattr(m, "recompile_reason", None)
                if reason is None and not (getattr(m, "cache_size", None) or 0) > 0:
                    continue  # a first compile (or one outside dynamo's frames): not a recompile
                count = self._counts.get(model, 0) + 1
                if len(self._counts) < 1024 or model in self._counts:
                    self._counts[model] = count
                frame = str(getattr(m, "co_name", None) or "?")
                fields: Dict[str, object] = {
                    "message": f"{model}: torch.compile recompiled {frame}"
                    + (f" ({_clip(reason, 160)})" if reason else ""),
                    "model": model,
                    "frame": frame,
                    "graphs": graphs,
                    "recompiles": count,
                }
                if reason:
                    fields["reason"] = _clip(reason, 500)
                if getattr(m, "compile_id", None) is not None:
                    fields["compile_id"] = str(m.compile_id)
                seconds = getattr(m, "entire_frame_compile_time_s", None)
                if seconds is not None:
                    fields["compile_ms"] = float(seconds) * 1000.0
                if getattr(m, "fail_type", None):
                    fields["error"] = _clip(f"{m.fail_type}: {getattr(m, 'fail_reason', '')}", 500)
                self._rec._submit(EVENT, self._tags, fields, time.time_ns(), None)
                sent += 1
            return sent


def _clip(text: object, limit: int) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 1] + "…"
