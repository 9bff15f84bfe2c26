"""edgewatch: report inference latency (wall, GPU and stage times) to an edgewatch agent
without slowing the model down.

    import edgewatch
    rec = edgewatch.Recorder("udp://127.0.0.1:8089", app="camera")
    with rec.infer("yolov8n", batch_size=4) as t:
        with t.stage("preprocess"):
            x = prep(frame)
        with t.gpu():
            y = model(x)

    with rec.generate("llama-3-8b", prompt_tokens=41, server="vllm") as g:
        for chunk in stream:
            g.token()

Standard library only. The integrations ``edgewatch.torch``, ``edgewatch.onnxruntime``,
``edgewatch.openai`` and ``edgewatch.transformers`` are imported on first use and never
import torch, onnxruntime, openai or transformers themselves.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

from ._gpu import EventFactory, GpuEvent
from ._llm import Generation
from ._recorder import GpuSpan, Inference, Recorder, Stage

if TYPE_CHECKING:  # pragma: no cover
    from . import onnxruntime, openai, torch, transformers

__version__ = "0.1.0"
__all__ = [
    "Recorder",
    "Inference",
    "Stage",
    "Generation",
    "GpuSpan",
    "GpuEvent",
    "EventFactory",
    "torch",
    "onnxruntime",
    "openai",
    "transformers",
    "__version__",
]

_LAZY = ("torch", "onnxruntime", "openai", "transformers")


def __getattr__(name: str) -> ModuleType:
    if name in _LAZY:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
