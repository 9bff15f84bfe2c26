"""edgewatch: report inference latency (wall, GPU and stage times) to an edgewatch agent
without slowing the model down.

    import edgewatch
    rec = edgewatch.Recorder("udp://127.0.0.1:8089", app="camera")
    with rec.infer("yolov8n", batch_size=4) as t:
        with t.stage("preprocess"):
            x = prep(frame)
        with t.gpu():
            y = model(x)

Standard library only. The integrations ``edgewatch.torch`` and ``edgewatch.onnxruntime``
are imported on first use and never import torch or onnxruntime themselves.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

from ._gpu import EventFactory, GpuEvent
from ._recorder import GpuSpan, Inference, Recorder, Stage

if TYPE_CHECKING:  # pragma: no cover
    from . import onnxruntime, torch

__version__ = "0.1.0"
__all__ = [
    "Recorder",
    "Inference",
    "Stage",
    "GpuSpan",
    "GpuEvent",
    "EventFactory",
    "torch",
    "onnxruntime",
    "__version__",
]

_LAZY = ("torch", "onnxruntime")


def __getattr__(name: str) -> ModuleType:
    if name in _LAZY:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
