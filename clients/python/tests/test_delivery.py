"""Points reach the real agent over UDP and over HTTP with a token, with the README's
`inference` tags and fields; exceptions are recorded as ok=false and re-raised unchanged;
close() flushes; a wrong token or an oversized batch never raises."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

import edgewatch
from conftest import Agent


def run_inferences(rec: edgewatch.Recorder, n: int) -> None:
    for i in range(n):
        with rec.infer("yolov8n", batch_size=4, input_length=640, model_version="3") as t:
            with t.stage("preprocess"):
                sum(range(200))
            with t.gpu():  # no torch/CUDA here: no gpu_ms
                pass
            with t.stage("postprocess"):
                pass
            t.set(queue_ms=float(i))


def check_inference_points(points: List[Dict[str, Any]], n: int) -> None:
    assert len(points) == n
    for i, p in enumerate(points):
        assert p["tags"] == {
            "model": "yolov8n",
            "model_version": "3",
            "app": "camera",
            "site": "a",
        }
        f = p["fields"]
        assert set(f) == {
            "wall_ms",
            "preprocess_ms",
            "postprocess_ms",
            "batch_size",
            "input_length",
            "queue_ms",
            "ok",
        }, f
        assert f["batch_size"] == 4 and f["input_length"] == 640 and f["ok"] is True
        assert f["queue_ms"] == float(i)
        assert 0 < f["preprocess_ms"] <= f["wall_ms"]
        assert 0 <= f["postprocess_ms"] <= f["wall_ms"]
        assert f["wall_ms"] < 1000


@pytest.mark.parametrize("transport", ["udp", "http"])
def test_every_inference_arrives_with_tags_and_stage_fields(tmp_path, transport: str) -> None:
    agent = Agent(tmp_path, token="tok-123").start()
    try:
        url = agent.udp_url if transport == "udp" else agent.http_url
        token = "tok-123" if transport == "http" else None
        before = time.time_ns()
        rec = edgewatch.Recorder(url, app="camera", tags={"site": "a"}, token=token)
        run_inferences(rec, 40)
        assert rec.flush(10.0)
        points = agent.wait_points(40)
        check_inference_points(points, 40)
        assert all(before <= p["ts"] <= time.time_ns() for p in points)
        assert rec.stats() == {"sent": 40, "dropped": 0, "errors": 0, "queued": 0, "gpu_timeouts": 0}
        rec.close()
    finally:
        agent.kill()


@pytest.mark.parametrize("transport", ["udp", "http"])
def test_exception_records_ok_false_and_reraises_the_same_exception(token_agent: Agent, transport: str) -> None:
    url = token_agent.udp_url if transport == "udp" else token_agent.http_url
    rec = edgewatch.Recorder(url, app="camera", token=token_agent.token if transport == "http" else None)
    boom = RuntimeError("model exploded")
    with pytest.raises(RuntimeError) as raised:
        with rec.infer("resnet", batch_size=1) as t:
            with t.stage("preprocess"):
                pass
            raise boom
    assert raised.value is boom
    assert raised.value.__traceback__ is not None
    # An exception inside a stage propagates through the stage and the inference unchanged.
    with pytest.raises(KeyError) as raised_key:
        with rec.infer("resnet", batch_size=2) as t:
            with t.stage("postprocess"):
                {}["missing"]
    assert raised_key.value.args == ("missing",)
    rec.close()
    points = token_agent.wait_points(2, model="resnet")
    assert [p["fields"]["ok"] for p in points] == [False, False]
    assert "preprocess_ms" in points[0]["fields"]
    assert "postprocess_ms" in points[1]["fields"]
    assert [p["fields"]["batch_size"] for p in points] == [1, 2]


def test_manual_record_and_other_measurements(agent: Agent) -> None:
    rec = edgewatch.Recorder(agent.udp_url, app="camera")
    assert rec.record(
        "yolov8n",
        wall_ms=18.2,
        gpu_ms=11.7,
        queue_ms=2.1,
        batch_size=4,
        input_length=640,
        ok=True,
        stages={"preprocess": 3.5},
        timestamp_ns=1_764_000_000_000_000_000,
    )
    assert rec.write("camera_frames", {"dropped": 3, "fps": 29.5}, tags={"cam": "front door"})
    rec.close()
    [p] = agent.wait_points(1)
    assert p["ts"] == 1_764_000_000_000_000_000
    assert p["tags"] == {"model": "yolov8n", "app": "camera"}
    assert p["fields"] == {
        "wall_ms": 18.2,
        "gpu_ms": 11.7,
        "queue_ms": 2.1,
        "batch_size": 4,
        "input_length": 640,
        "ok": True,
        "preprocess_ms": 3.5,
    }
    [q] = agent.wait_points(1, measurement="camera_frames")
    assert q["tags"] == {"cam": "front door", "app": "camera"}
    assert q["fields"] == {"dropped": 3, "fps": 29.5}


@pytest.mark.parametrize("transport", ["udp", "http"])
def test_close_flushes_everything_recorded(token_agent: Agent, transport: str) -> None:
    url = token_agent.udp_url if transport == "udp" else token_agent.http_url
    # A flush interval far longer than the test: only close() can have sent the points.
    rec = edgewatch.Recorder(
        url, token=token_agent.token if transport == "http" else None, flush_interval=3600, batch_points=100_000
    )
    for i in range(500):
        rec.record("m", wall_ms=float(i))
    rec.close(timeout=10)
    assert rec.stats()["sent"] == 500 and rec.stats()["queued"] == 0
    points = token_agent.wait_points(500)
    assert sorted(p["fields"]["wall_ms"] for p in points) == [float(i) for i in range(500)]
    # After close, recording drops and counts, never raises.
    assert rec.record("m", wall_ms=1.0) is False
    assert rec.stats()["dropped"] == 1


def test_wrong_token_is_counted_not_raised(token_agent: Agent) -> None:
    rec = edgewatch.Recorder(token_agent.http_url, token="wrong")
    rec.record("m", wall_ms=1.0)
    with rec.infer("m"):
        pass
    rec.flush(5)
    stats = rec.stats()
    assert stats["sent"] == 0 and stats["dropped"] == 2 and stats["errors"] >= 1
    rec.close()
    assert token_agent.points() == []


def test_batch_larger_than_the_agent_queue_is_split_not_lost(tmp_path) -> None:
    # The agent refuses a body with more points than its whole queue (413): the client halves
    # the batch until it fits.
    agent = Agent(tmp_path, extra_config="[ingest]\nqueue_points = 64\nmax_batch_points = 64\n").start()
    try:
        rec = edgewatch.Recorder(agent.http_url, batch_points=1000, flush_interval=3600)
        for i in range(300):
            rec.record("m", wall_ms=float(i))
        rec.close(timeout=20)
        stats = rec.stats()
        assert stats["sent"] == 300 and stats["dropped"] == 0, stats
        assert len(agent.wait_points(300)) == 300
    finally:
        agent.kill()


@pytest.mark.parametrize("transport", ["udp", "http"])
def test_interpreter_exit_flushes_an_unclosed_recorder(agent: Agent, transport: str) -> None:
    url = agent.udp_url if transport == "udp" else agent.http_url
    code = (
        "import edgewatch\n"
        f"rec = edgewatch.Recorder({url!r}, flush_interval=3600, batch_points=100000)\n"
        "for i in range(300):\n"
        "    rec.record('at_exit', wall_ms=float(i))\n"
        "# no close(): the interpreter's exit must send them\n"
    )
    subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        timeout=60,
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"), "PATH": "/usr/bin:/bin"},
    )
    assert len(agent.wait_points(300, model="at_exit")) == 300


@pytest.mark.parametrize("transport", ["udp", "http"])
def test_a_forked_child_records_through_its_own_sender(agent: Agent, transport: str) -> None:
    url = agent.udp_url if transport == "udp" else agent.http_url
    rec = edgewatch.Recorder(url, flush_interval=3600, batch_points=100_000)
    for i in range(5):
        rec.record("parent", wall_ms=float(i))  # still queued at the fork
    pid = os.fork()
    if pid == 0:  # the child: its own sender sends its points, never the parent's
        code = 1
        try:
            for i in range(10):
                with rec.infer("child", batch_size=i):
                    pass
            rec.close(timeout=10)
            s = rec.stats()
            code = 0 if (s["sent"], s["dropped"]) == (10, 0) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    rec.close(timeout=10)
    assert rec.stats()["sent"] == 5
    assert len(agent.wait_points(10, model="child")) == 10
    assert len(agent.wait_points(5, model="parent")) == 5
