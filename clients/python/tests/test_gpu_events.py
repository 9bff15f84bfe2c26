"""GPU time done right, checked with a test double of the CUDA event API: the application's
thread only records events (never synchronize, query or elapsed_time); the sender thread
reads the time once query() says the events completed, and only then sends the point."""

from __future__ import annotations

import sys
import threading
from typing import Any, List, Tuple

import pytest

import edgewatch
from conftest import Agent, require


class FakeDevice:
    """The GPU: events complete when the test says so. Every call is logged with the
    thread that made it."""

    def __init__(self, span_ms: float = 7.5) -> None:
        self.done = False
        self.span_ms = span_ms
        self.calls: List[Tuple[str, str]] = []
        self.lock = threading.Lock()

    def log(self, name: str) -> None:
        with self.lock:
            self.calls.append((name, threading.current_thread().name))

    def event(self, **kwargs: Any) -> "FakeEvent":
        return FakeEvent(self, **kwargs)


class FakeEvent:
    """The part of torch.cuda.Event the client may touch, plus the blocking calls it must
    never make on the hot path."""

    def __init__(self, device: FakeDevice, enable_timing: bool = True) -> None:
        assert enable_timing
        self.device = device
        self.recorded = False

    def record(self, stream: Any = None) -> None:
        self.device.log("record")
        self.recorded = True

    def query(self) -> bool:
        self.device.log("query")
        return self.recorded and self.device.done

    def elapsed_time(self, end: "FakeEvent") -> float:
        self.device.log("elapsed_time")
        if not (self.device.done and end.recorded):
            raise RuntimeError("elapsed_time before the events completed")
        return self.device.span_ms

    def synchronize(self) -> None:
        self.device.log("synchronize")
        raise AssertionError("synchronize() called: the client must never wait for the GPU")

    def wait(self, stream: Any = None) -> None:
        self.device.log("wait")
        raise AssertionError("wait() called")


def infer_with_gpu(rec: edgewatch.Recorder, model: str, spans: int = 2) -> None:
    with rec.infer(model, batch_size=1) as t:
        with t.stage("preprocess"):
            pass
        for _ in range(spans):
            with t.gpu():
                pass


def test_hot_path_only_records_and_the_sender_resolves_after_completion(agent: Agent) -> None:
    dev = FakeDevice(span_ms=7.5)
    rec = edgewatch.Recorder(agent.udp_url, gpu_events=dev.event, gpu_poll_interval=0.001)
    infer_with_gpu(rec, "gpu_model", spans=2)
    app_thread = threading.current_thread().name
    # The application's thread made exactly the four record() calls, nothing else.
    assert [c for c in dev.calls if c[1] == app_thread] == [("record", app_thread)] * 4
    # Not sent while the GPU has not finished: the sender polls query() and waits.
    assert rec.flush(0.3) is False
    assert rec.stats()["queued"] == 1 and rec.stats()["sent"] == 0
    assert any(name == "query" for name, _ in dev.calls)
    assert agent.points(model="gpu_model") == []
    dev.done = True
    assert rec.flush(5)
    [p] = agent.wait_points(1, model="gpu_model")
    assert p["fields"]["gpu_ms"] == 15.0  # two spans of 7.5 ms
    assert "wall_ms" in p["fields"] and "preprocess_ms" in p["fields"]
    # Every query/elapsed_time came from the sender thread; nobody synchronised.
    others = {(n, t) for n, t in dev.calls if n != "record"}
    assert others and all(t == "edgewatch-sender" for _, t in others), others
    assert not any(n in ("synchronize", "wait") for n, _ in dev.calls)
    rec.close()


def test_events_that_never_complete_send_the_point_without_gpu_ms(agent: Agent) -> None:
    dev = FakeDevice()
    rec = edgewatch.Recorder(agent.udp_url, gpu_events=dev.event, gpu_poll_interval=0.001, gpu_timeout=0.2)
    infer_with_gpu(rec, "stuck", spans=1)
    assert rec.flush(5)
    [p] = agent.wait_points(1, model="stuck")
    assert "gpu_ms" not in p["fields"]
    assert rec.stats()["gpu_timeouts"] == 1
    rec.close()


def test_close_waits_for_pending_events_then_sends(agent: Agent) -> None:
    dev = FakeDevice(span_ms=3.0)
    rec = edgewatch.Recorder(agent.udp_url, gpu_events=dev.event, gpu_poll_interval=0.001)
    infer_with_gpu(rec, "closing", spans=1)
    threading.Timer(0.2, lambda: setattr(dev, "done", True)).start()
    rec.close(timeout=5)
    [p] = agent.wait_points(1, model="closing")
    assert p["fields"]["gpu_ms"] == 3.0


def test_torch_cuda_events_are_found_through_torch_and_never_synchronised(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default clock: torch imported by the app, CUDA available (here a double of
    torch.cuda.Event / is_available / synchronize on the real torch module)."""
    torch = require("torch", "torch")
    dev = FakeDevice(span_ms=4.25)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", dev.event)

    def no_sync(*args: Any, **kwargs: Any) -> None:
        dev.log("torch.cuda.synchronize")
        raise AssertionError("torch.cuda.synchronize() called")

    monkeypatch.setattr(torch.cuda, "synchronize", no_sync)
    rec = edgewatch.Recorder(agent.udp_url, gpu_poll_interval=0.001)
    infer_with_gpu(rec, "torch_gpu", spans=1)
    dev.done = True
    rec.close()
    [p] = agent.wait_points(1, model="torch_gpu")
    assert p["fields"]["gpu_ms"] == 4.25
    assert not any(n in ("synchronize", "wait", "torch.cuda.synchronize") for n, _ in dev.calls)


def test_without_torch_gpu_ms_is_absent_and_torch_is_not_imported(agent: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    # As if the application never imported torch.
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    rec = edgewatch.Recorder(agent.udp_url)
    infer_with_gpu(rec, "cpu_only", spans=1)
    rec.close()
    [p] = agent.wait_points(1, model="cpu_only")
    assert "gpu_ms" not in p["fields"]
    assert "torch" not in sys.modules


def test_gpu_disabled_never_touches_events(agent: Agent) -> None:
    dev = FakeDevice()
    rec = edgewatch.Recorder(agent.udp_url, gpu=False, gpu_events=dev.event)
    infer_with_gpu(rec, "no_gpu", spans=1)
    rec.close()
    [p] = agent.wait_points(1, model="no_gpu")
    assert "gpu_ms" not in p["fields"] and dev.calls == []
