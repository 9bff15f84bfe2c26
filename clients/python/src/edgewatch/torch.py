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

torch is never imported here: the hooks are registered through the module you pass.
An exception inside ``forward`` is recorded as ``ok=false`` (on torch >= 2.0, whose
``always_call`` hooks run on an exception) and propagates unchanged.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from ._recorder import GpuSpan, Inference, Recorder

Sizes = Callable[[Tuple[Any, ...], Mapping[str, Any]], Tuple[Optional[int], Optional[int]]]

__all__ = ["instrument", "Instrumented", "input_sizes", "MODULE_MEASUREMENT"]

MODULE_MEASUREMENT = "inference_module"


def _first_shape(args: Iterable[Any]) -> Optional[Tuple[int, ...]]:
    for value in args:
        shape = getattr(value, "shape", None)
        if shape is not None:
            return tuple(int(d) for d in shape)
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
    shape = _first_shape(args)
    if shape is None:
        shape = _first_shape(kwargs.values())
    if not shape:
        return None, None
    return shape[0], (shape[-1] if len(shape) >= 2 else None)


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
) -> Instrumented:
    """Records each ``module(...)`` call as an ``inference`` point of ``model``.

    ``per_module``: ``True`` times the direct children, a list of names (as in
    ``module.named_modules()``) times those; one call in ``sample_every`` is timed so that
    the hooks cost nothing on the others. ``sizes(args, kwargs)`` overrides how batch size
    and input length are read (default: :func:`input_sizes`)."""
    if sample_every < 1:
        raise ValueError("sample_every must be at least 1")
    read_sizes: Sizes = sizes or input_sizes
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
            batch, length = read_sizes(args, kwargs)
        except Exception:
            batch, length = None, None
        inf = rec.infer(
            model,
            batch_size=batch,
            input_length=length,
            model_version=model_version,
            stage=stage,
            tags=extra_tags,
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
