"""edgewatch.onnxruntime.InstrumentedSession on a real onnxruntime (CPU) session over a small
model built here with onnx.helper (nothing downloaded)."""

from __future__ import annotations

from typing import Any

import pytest

import edgewatch
from conftest import Agent, require
from edgewatch.onnxruntime import InstrumentedSession


def small_session(features: int = 16, hidden: int = 8) -> Any:
    """A MatMul + Relu model, [N, features] -> [N, hidden], in an onnxruntime CPU session."""
    onnx = require("onnx", "onnx")
    ort = require("onnxruntime", "onnxruntime")
    np = require("numpy", "numpy")
    from onnx import TensorProto, helper, numpy_helper

    weights = numpy_helper.from_array(
        np.arange(features * hidden, dtype=np.float32).reshape(features, hidden) / 100.0, name="W"
    )
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["h"]),
            helper.make_node("Relu", ["h"], ["y"]),
        ],
        "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", hidden])],
        [weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_every_run_is_an_inference_point_with_sizes_from_the_input(token_agent: Agent) -> None:
    np = require("numpy", "numpy")
    session = small_session()
    rec = edgewatch.Recorder(token_agent.http_url, token=token_agent.token, app="detector")
    wrapped = InstrumentedSession(session, rec, model="small", model_version="1")
    # The wrapper is transparent: same outputs, the session's own attributes.
    assert [i.name for i in wrapped.get_inputs()] == ["x"]
    for batch in (1, 4, 4, 2):
        x = np.ones((batch, 16), dtype=np.float32)
        [y] = wrapped.run(None, {"x": x})
        [expected] = session.run(None, {"x": x})
        assert y.shape == (batch, 8) and (y == expected).all()
    rec.close()
    points = token_agent.wait_points(4, model="small")
    assert [p["fields"]["batch_size"] for p in points] == [1, 4, 4, 2]
    for p in points:
        assert p["tags"] == {"model": "small", "model_version": "1", "app": "detector"}
        assert p["fields"]["input_length"] == 16
        assert p["fields"]["ok"] is True
        assert 0 < p["fields"]["wall_ms"] < 1000
        assert "gpu_ms" not in p["fields"]


def test_a_failing_run_is_ok_false_and_the_onnxruntime_error_propagates(agent: Agent) -> None:
    np = require("numpy", "numpy")
    session = small_session()
    rec = edgewatch.Recorder(agent.udp_url)
    wrapped = InstrumentedSession(session, rec, model="small")
    bad = {"x": np.ones((2, 5), dtype=np.float32)}  # wrong feature count
    with pytest.raises(Exception) as via_wrapper:
        wrapped.run(None, bad)
    with pytest.raises(Exception) as direct:
        session.run(None, bad)
    assert type(via_wrapper.value) is type(direct.value)
    assert str(via_wrapper.value) == str(direct.value)
    rec.close()
    [p] = agent.wait_points(1, model="small")
    assert p["fields"]["ok"] is False and p["fields"]["batch_size"] == 2
