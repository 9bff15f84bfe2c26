"""edgewatch.torch.instrument and stage timing with a real torch (CPU): forward hooks give one
inference point per call, exceptions give ok=false and propagate, per-module timing is
sampled into `inference_module`; no CUDA here, so no gpu_ms."""

from __future__ import annotations

from typing import Any

import pytest

import edgewatch
from conftest import Agent, require


def small_model() -> Any:
    torch = require("torch", "torch")
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)
    ).eval()


def test_instrumented_module_records_each_forward(agent: Agent) -> None:
    torch = require("torch", "torch")
    model = small_model()
    rec = edgewatch.Recorder(agent.http_url, app="cam")
    hooks = edgewatch.torch.instrument(model, rec, model="mlp", model_version="2")
    with torch.no_grad():
        for batch in (1, 3, 5):
            out = model(torch.ones(batch, 32))
            assert out.shape == (batch, 4)
    hooks.remove()
    with torch.no_grad():
        model(torch.ones(7, 32))  # not recorded any more
    rec.close()
    points = agent.wait_points(3, model="mlp")
    assert len(points) == 3
    assert [p["fields"]["batch_size"] for p in points] == [1, 3, 5]
    for p in points:
        assert p["tags"] == {"model": "mlp", "model_version": "2", "app": "cam"}
        assert p["fields"]["input_length"] == 32 and p["fields"]["ok"] is True
        assert "gpu_ms" not in p["fields"]  # torch on CPU: no CUDA events


def test_exception_in_forward_is_ok_false_and_propagates_unchanged(agent: Agent) -> None:
    torch = require("torch", "torch")
    model = small_model()
    rec = edgewatch.Recorder(agent.udp_url)
    edgewatch.torch.instrument(model, rec, model="mlp")
    with pytest.raises(RuntimeError) as via_hooks:
        model(torch.ones(2, 31))  # wrong width
    assert "shapes cannot be multiplied" in str(via_hooks.value)
    model(torch.ones(2, 32))
    rec.close()
    points = agent.wait_points(2, model="mlp")
    assert [p["fields"]["ok"] for p in points] == [False, True]
    assert points[0]["fields"]["input_length"] == 31


def test_per_module_timing_is_sampled_into_its_own_measurement(agent: Agent) -> None:
    torch = require("torch", "torch")
    model = small_model()
    rec = edgewatch.Recorder(agent.udp_url)
    edgewatch.torch.instrument(model, rec, model="mlp", per_module=True, sample_every=2)
    with torch.no_grad():
        for _ in range(6):
            model(torch.ones(2, 32))
    rec.close()
    assert len(agent.wait_points(6, model="mlp")) == 6
    modules = agent.wait_points(9, measurement="inference_module")  # 3 sampled calls x 3 children
    assert sorted({p["tags"]["module"] for p in modules}) == ["0", "1", "2"]
    assert all(p["tags"]["model"] == "mlp" and p["fields"]["ok"] is True for p in modules)
    assert all(0 <= p["fields"]["wall_ms"] < 1000 for p in modules)
    with pytest.raises(ValueError, match="no submodule"):
        edgewatch.torch.instrument(model, rec, model="x", per_module=["nope"])


def test_stage_timing_around_torch_work(agent: Agent) -> None:
    torch = require("torch", "torch")
    model = small_model()
    rec = edgewatch.Recorder(agent.udp_url)
    for _ in range(3):
        with rec.infer("mlp_manual", batch_size=8, input_length=32) as t:
            with t.stage("preprocess"):
                x = torch.randn(8, 32) * 2 + 1
            with t.gpu(), torch.no_grad():
                y = model(x)
            with t.stage("postprocess"):
                y.argmax(dim=1).tolist()
    rec.close()
    points = agent.wait_points(3, model="mlp_manual")
    for p in points:
        f = p["fields"]
        assert f["preprocess_ms"] > 0 and f["postprocess_ms"] > 0
        assert f["preprocess_ms"] + f["postprocess_ms"] < f["wall_ms"]
        assert "gpu_ms" not in f
