"""ONNX Runtime integration: ``InstrumentedSession`` wraps an ``InferenceSession`` so that
every ``run`` is one ``inference`` point (``wall_ms``, ``ok``, ``batch_size`` and
``input_length`` from the first input's shape).

It never imports onnxruntime (it wraps whatever session it is given) and never changes
what ``run`` returns or raises. ONNX Runtime's ``run`` returns when its outputs are ready,
so ``wall_ms`` includes the device time; ``gpu_ms`` is not measured here.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence, Tuple

from ._recorder import Recorder

Sizes = Callable[[Mapping[str, Any]], Tuple[Optional[int], Optional[int]]]

__all__ = ["InstrumentedSession", "input_sizes"]


def input_sizes(input_feed: Mapping[str, Any]) -> Tuple[Optional[int], Optional[int]]:
    """``(batch_size, input_length)`` from the first input with a shape: its first
    dimension, and its last when it has two or more (sequence length, image width)."""
    for value in input_feed.values():
        shape = getattr(value, "shape", None)
        if shape is None:
            continue
        dims = tuple(shape)
        batch = int(dims[0]) if len(dims) >= 1 else None
        length = int(dims[-1]) if len(dims) >= 2 else None
        return batch, length
    return None, None


class InstrumentedSession:
    """Wraps ``session`` (an ``onnxruntime.InferenceSession``): ``run`` is timed and
    recorded as ``model``; every other attribute is the session's own."""

    def __init__(
        self,
        session: Any,
        rec: Recorder,
        model: str,
        *,
        model_version: Optional[str] = None,
        stage: Optional[str] = None,
        tags: Optional[Mapping[str, str]] = None,
        sizes: Optional[Sizes] = None,
    ) -> None:
        self.session = session
        self._rec = rec
        self._model = model
        self._version = model_version
        self._stage = stage
        self._tags = dict(tags) if tags else None
        self._sizes: Sizes = sizes or input_sizes

    def run(
        self,
        output_names: Optional[Sequence[str]],
        input_feed: Mapping[str, Any],
        run_options: Any = None,
    ) -> Any:
        """``session.run(...)``, timed. An exception is recorded as ``ok=false`` and
        re-raised unchanged."""
        try:
            batch, length = self._sizes(input_feed)
        except Exception:
            batch, length = None, None
        with self._rec.infer(
            self._model,
            batch_size=batch,
            input_length=length,
            model_version=self._version,
            stage=self._stage,
            tags=self._tags,
        ):
            return self.session.run(output_names, input_feed, run_options)

    def __getattr__(self, name: str) -> Any:
        if name == "session":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.session, name)
