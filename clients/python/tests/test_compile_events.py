"""Recompilations and slow first calls as `edgewatch_event` points, with a real torch on the
CPU and the real agent: a `torch.compile`d module (dynamic=False) called with changing
shapes makes dynamo recompile, and each recompilation is one `recompile` event; a call on a
new shape far slower than the model's steady state is one `slow_first_call` event; steady
calls and a model that never recompiles record none."""

from __future__ import annotations

import time
from typing import Any, Dict, List, Set, Tuple

import edgewatch
from conftest import Agent, require

EVENT = "edgewatch_event"


def mlp() -> Any:
    torch = require("torch", "torch")
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)
    ).eval()


def fresh_dynamo() -> Any:
    """A clean dynamo: its caches are per code object, shared by every Sequential."""
    torch = require("torch", "torch")
    torch._dynamo.reset()
    return torch


def run(model: Any, batches: List[int]) -> None:
    torch = require("torch", "torch")
    with torch.no_grad():
        for b in batches:
            model(torch.ones(b, 32))


def events(agent: Agent, kind: str) -> List[Dict[str, Any]]:
    return agent.points(EVENT, kind=kind)


def test_dynamo_recompilations_are_recompile_events(agent: Agent) -> None:
    torch = fresh_dynamo()
    compiled = torch.compile(mlp(), dynamic=False, backend="eager")
    rec = edgewatch.Recorder(agent.http_url, app="cam", tags={"site": "a"}, first_call_min_ms=5)
    edgewatch.torch.instrument(compiled, rec, model="mlp")
    # batch 1 compiles, 2 and 3 recompile (dynamic=False: one graph per shape), the last
    # calls hit graphs already there.
    run(compiled, [1] * 6 + [2] * 3 + [3] * 3 + [1, 2, 3])
    rec.close()
    assert len(agent.wait_points(15, model="mlp")) == 15
    got = agent.wait_points(2, EVENT, kind="recompile")
    assert len(got) == 2, got
    for n, (p, (old, new)) in enumerate(zip(got, [(1, 2), (2, 3)]), start=1):
        assert p["tags"] == {
            "kind": "recompile",
            "severity": "warning",
            "source": "python",
            "app": "cam",
            "site": "a",
        }
        f = p["fields"]
        assert f["model"] == "mlp" and f["recompiles"] == n
        assert "size mismatch" in f["reason"] and f"expected {old}, actual {new}" in f["reason"]
        assert f["compile_id"] == f"0/{n}"
        assert f["graphs"] == n + 1
        assert f["compile_ms"] > 0
        assert f["message"].startswith("mlp: torch.compile recompiled ")
        assert "error" not in f
    # Every first call on a shape paid dynamo's compile: one slow_first_call each, none
    # for the steady calls.
    slow = events(agent, "slow_first_call")
    assert sorted(p["fields"]["shape"] for p in slow) == ["1x32", "2x32", "3x32"], slow
    for p in slow:
        f = p["fields"]
        assert f["model"] == "mlp" and f["wall_ms"] > 5 and f["ratio"] > 5
        assert f["wall_ms"] > 5 * f["steady_ms"]


def slow_on_first_sight(slow: Set[Tuple[int, ...]], delay_s: float) -> Any:
    """A module that, like autotuning, spends `delay_s` on the first call of some shapes."""
    torch = require("torch", "torch")

    class Module(torch.nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.inner = mlp()
            self.seen: Set[Tuple[int, ...]] = set()

        def forward(self, x: Any) -> Any:
            shape = tuple(x.shape)
            if shape in slow and shape not in self.seen:
                time.sleep(delay_s)
            self.seen.add(shape)
            return self.inner(x)

    return Module()


def test_one_slow_first_call_event_and_none_for_steady_calls(agent: Agent) -> None:
    model = slow_on_first_sight({(4, 32)}, delay_s=0.15)
    run(model, [3])  # torch's own first-call set-up, before the recorder sees a call
    # A floor of 50 ms: a busy test machine can stall any call for 20.
    rec = edgewatch.Recorder(agent.udp_url, app="cam", first_call_min_ms=50)
    edgewatch.torch.instrument(model, rec, model="sleepy")
    # New shapes 1 and 2 are fast on first sight (no event), 4 is slow once.
    run(model, [1] * 10 + [2] * 3 + [4] * 5 + [1] * 3)
    rec.close()
    points = agent.wait_points(21, model="sleepy")
    agent.wait_points(1, EVENT, kind="slow_first_call")
    got = events(agent, "slow_first_call")  # sent before the last points: all there
    assert len(got) == 1, got
    p = got[0]
    assert p["tags"] == {"kind": "slow_first_call", "severity": "warning", "source": "python", "app": "cam"}
    f = p["fields"]
    assert f["model"] == "sleepy" and f["shape"] == "4x32"
    assert f["wall_ms"] >= 150 and f["steady_ms"] < 20 and abs(f["ratio"] - f["wall_ms"] / f["steady_ms"]) < 1e-6 * f["ratio"]
    assert "sleepy: the first call on input 4x32 took" in f["message"]
    # Stamped like the slow inference itself.
    slow_point = [q for q in points if q["fields"]["wall_ms"] >= 150]
    assert len(slow_point) == 1 and slow_point[0]["ts"] == p["ts"]
    assert slow_point[0]["fields"]["batch_size"] == 4
    assert events(agent, "recompile") == []


def test_rec_infer_first_calls_with_explicit_shape_and_the_warm_up(agent: Agent) -> None:
    rec = edgewatch.Recorder(agent.http_url, first_call_ratio=4, first_call_min_ms=30)
    # The very first call (warm-up) waits until the model has a steady state (5 calls on a
    # seen shape), then is judged like any other first call, stamped at its own time.
    with rec.infer("enc", shape=(1, 128)):
        time.sleep(0.05)
    for _ in range(6):
        with rec.infer("enc", shape=(1, 128)):
            pass
    with rec.infer("enc", shape="long-prompt"):  # any hashable name for the input's kind
        time.sleep(0.05)
    with rec.infer("enc", shape=(1, 256)):  # new but fast: no event
        time.sleep(0.001)
    with rec.infer("enc", batch_size=2, input_length=64):  # sizes stand for the shape
        time.sleep(0.05)
    with rec.infer("enc", batch_size=2, input_length=64):  # seen: steady, slow or not
        time.sleep(0.05)
    with rec.infer("enc"):  # no shape, no sizes: never a first call
        time.sleep(0.05)
    rec.close()
    points = agent.wait_points(12, model="enc")
    got = agent.wait_points(3, EVENT, kind="slow_first_call")
    assert [p["fields"]["shape"] for p in got] == ["1x128", "long-prompt", "batch_size=2,input_length=64"]
    assert got[0]["ts"] == points[0]["ts"]
    assert all(p["fields"]["wall_ms"] >= 50 for p in got)


def test_control_runs_record_no_events(agent: Agent) -> None:
    torch = fresh_dynamo()
    # Eager, with new shapes that are not slow: nothing.
    rec = edgewatch.Recorder(agent.http_url, first_call_min_ms=50)
    run_model = mlp()
    run(run_model, [3])  # torch's own first-call set-up, before the recorder sees a call
    edgewatch.torch.instrument(run_model, rec, model="eager2")
    run(run_model, [1] * 8 + [2] * 8 + [3] * 8)
    # Compiled, one shape only: it compiles once and never recompiles.
    compiled = torch.compile(mlp(), dynamic=False, backend="eager")
    rec2 = edgewatch.Recorder(agent.http_url, first_call_ratio=None)
    edgewatch.torch.instrument(compiled, rec2, model="compiled")
    run(compiled, [4] * 20)
    # rec.infer without shape or sizes around the compiled model: nothing either.
    watch = edgewatch.torch.RecompileWatch(rec)
    with torch.no_grad():
        for _ in range(5):
            with rec.infer("manual"):
                compiled(torch.ones(4, 32))
            assert watch.check("manual") == 0
    rec.close()
    rec2.close()
    agent.wait_points(24, model="eager2")
    agent.wait_points(20, model="compiled")
    agent.wait_points(5, model="manual")
    assert agent.points(EVENT) == []


def test_recompile_watch_around_rec_infer(agent: Agent) -> None:
    torch = fresh_dynamo()
    compiled = torch.compile(mlp(), dynamic=False, backend="eager")
    rec = edgewatch.Recorder(agent.udp_url, first_call_ratio=None)
    watch = edgewatch.torch.RecompileWatch(rec)  # before dynamo compiled anything
    counts = []
    with torch.no_grad():
        for b in (1, 1, 5, 5, 6):
            x = torch.ones(b, 32)
            with rec.infer("manual", shape=x.shape):
                compiled(x)
            counts.append(watch.check("manual"))
    rec.close()
    assert counts == [0, 0, 1, 0, 1]
    got = agent.wait_points(2, EVENT, kind="recompile")
    assert [p["fields"]["recompiles"] for p in got] == [1, 2]
    assert all(p["fields"]["model"] == "manual" for p in got)
    assert events(agent, "slow_first_call") == []


def test_shapes_remembered_are_bounded_and_events_of_the_app(agent: Agent) -> None:
    rec = edgewatch.Recorder(agent.http_url, first_call_shapes=2, first_call_min_ms=30)

    def call(shape: str, slow: bool) -> None:
        with rec.infer("cap", shape=shape):
            if slow:
                time.sleep(0.05)

    for _ in range(6):
        call("a", False)
    call("b", True)  # event; remembers a, b
    call("c", True)  # event; forgets a (the oldest seen)
    call("b", True)  # still remembered: a steady call, however slow
    call("a", True)  # forgotten, so new again: event
    # Bad input raises at the call and loses nothing already recorded.
    try:
        rec.event("reload", "bad", severity="fatal")
        raise AssertionError("a bad severity must raise")
    except ValueError as e:
        assert "severity must be one of" in str(e)
    assert rec.event("reload", "cam: model reloaded from disk", model="cap", took_ms=12.5)
    for bad in ({"first_call_ratio": 1.0}, {"first_call_min_ms": -1.0}, {"first_call_shapes": 0}):
        try:
            edgewatch.Recorder(agent.http_url, **bad)  # type: ignore[arg-type]
            raise AssertionError(f"{bad} must raise")
        except ValueError:
            pass
    rec.close()
    assert len(agent.wait_points(10, model="cap")) == 10
    got = agent.wait_points(3, EVENT, kind="slow_first_call")
    assert [p["fields"]["shape"] for p in got] == ["b", "c", "a"]
    reload = agent.wait_points(1, EVENT, kind="reload")
    assert reload[0]["tags"] == {"kind": "reload", "severity": "info", "source": "python"}
    assert reload[0]["fields"] == {"message": "cam: model reloaded from disk", "model": "cap", "took_ms": 12.5}
