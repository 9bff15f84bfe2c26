"""The Python client's GPU time against a real CUDA device, for a machine with an NVIDIA GPU.

Run by ``tests/nvml_hardware/device.sh`` (not by ``scripts/test.sh``: the build machine has no
GPU, where ``clients/python/tests/test_gpu_events.py`` checks the same contract with a test
double of the event API). Needs torch with CUDA and the agent binary in ``EDGEWATCH_BIN``.

What it checks, with real ``torch.cuda.Event``s and real kernels:

- ``gpu_ms`` stored by the agent for a block of chained matrix products matches the GPU time
  measured independently (events around the same work, synchronised, outside the client);
- ``gpu_ms`` grows with the work (1, 4, 16 products) and never exceeds ``wall_ms`` when the
  block waits for its result;
- the application's thread never waits for the GPU: with no synchronisation in the block,
  the time spent inside ``t.gpu()`` is a small part of the GPU time it measured;
- ``edgewatch.torch.instrument`` on a CUDA module gives every call a ``gpu_ms``;
- what a two-stage ``rec.infer`` with ``t.gpu()`` costs over the floor of the same ``with``
  blocks doing nothing, with real events (printed; the budget is 10 µs).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients" / "python" / "src"))
sys.path.insert(0, str(ROOT / "clients" / "python" / "tests"))

import edgewatch  # noqa: E402
import edgewatch.torch as ew_torch  # noqa: E402
from conftest import Agent, require  # noqa: E402

torch: Any = require("torch", "torch")
if not torch.cuda.is_available():
    pytest.fail("no CUDA device: this check needs an NVIDIA GPU and torch with CUDA", pytrace=False)

N = 4096


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    a = Agent(tmp_path).start()
    try:
        yield a
    finally:
        a.kill()


@pytest.fixture(scope="module")
def operands() -> Any:
    a = torch.randn(N, N, device="cuda", dtype=torch.float16)
    b = torch.randn(N, N, device="cuda", dtype=torch.float16)
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    return a, b


def reference_ms(a: Any, b: Any, k: int, runs: int = 9) -> float:
    """The GPU time of ``k`` chained products, measured outside the client (median)."""
    out = []
    for _ in range(runs):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(k):
            a @ b
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e))
    return float(statistics.median(out))


def test_gpu_ms_matches_independent_events_and_grows_with_the_work(agent: Agent, operands: Any) -> None:
    a, b = operands
    rec = edgewatch.Recorder(agent.udp_url, app="cuda-check")
    assert rec._clock.event() is not None, "the client found no CUDA clock although torch has CUDA"
    per_k = 15
    own: Dict[int, List[Any]] = {}
    refs: Dict[int, float] = {}
    for k in (1, 4, 16):
        refs[k] = reference_ms(a, b, k)
        for _ in range(per_k):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with rec.infer(f"matmul-x{k}", batch_size=k) as t:
                with t.gpu():
                    s.record()  # the test's own events, around the same kernels
                    for _ in range(k):
                        y = a @ b
                    e.record()
                with t.stage("postprocess"):
                    float(y[0, 0].item())  # waits for the result, as an application does
            own.setdefault(k, []).append((s, e))
    rec.close()
    assert rec.stats()["gpu_timeouts"] == 0, rec.stats()
    points = agent.wait_points(3 * per_k, timeout_s=20.0)
    medians: Dict[int, float] = {}
    for k in (1, 4, 16):
        mine = [p for p in points if p["tags"]["model"] == f"matmul-x{k}"]
        assert len(mine) == per_k, mine[:2]
        theirs = [s.elapsed_time(e) for s, e in own[k]]
        print(f"x{k} pairs (stored, own):", [(round(p["fields"]["gpu_ms"], 4), round(t, 4)) for p, t in zip(mine, theirs)])
        for p, t_ms in zip(mine, theirs):
            gpu = p["fields"]["gpu_ms"]
            assert gpu <= p["fields"]["wall_ms"] + 0.05, p
            # The client's events wrap the test's: its span also holds the launch of the
            # test's first event (tens of µs of host time with the GPU idle).
            assert -0.005 <= gpu - t_ms <= max(0.03 * t_ms, 0.05), (k, gpu, t_ms)
        medians[k] = float(statistics.median(p["fields"]["gpu_ms"] for p in mine))
        print(
            f"x{k}: stored gpu_ms median {medians[k]:.3f} ms, the test's own events "
            f"{statistics.median(theirs):.3f} ms, back-to-back reference {refs[k]:.3f} ms"
        )
    ratio = medians[16] / medians[1]
    print(f"gpu_ms x16 / x1 = {ratio:.2f}")
    assert 10.0 <= ratio <= 20.0, ratio


def test_the_application_thread_never_waits_for_the_gpu(agent: Agent, operands: Any) -> None:
    a, b = operands
    rec = edgewatch.Recorder(agent.udp_url, app="cuda-check")
    inside: List[float] = []
    for _ in range(10):
        torch.cuda.synchronize()
        with rec.infer("async") as t:
            t0 = time.perf_counter()
            with t.gpu():
                for _ in range(16):
                    a @ b
            inside.append((time.perf_counter() - t0) * 1000.0)
        torch.cuda.synchronize()
    rec.close()
    points = agent.wait_points(10, timeout_s=20.0, model="async")
    gpu = statistics.median(p["fields"]["gpu_ms"] for p in points)
    host = statistics.median(inside)
    print(f"16 products: {gpu:.3f} ms on the GPU, {host:.3f} ms in the application's thread")
    assert host < 0.5 * gpu, (host, gpu)


def test_instrumented_cuda_module_has_gpu_time_per_call(agent: Agent) -> None:
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)
    ).cuda()
    rec = edgewatch.Recorder(agent.udp_url, app="cuda-check")
    handle = ew_torch.instrument(model, rec, model="mlp")
    x = torch.randn(64, 1024, device="cuda")
    with torch.no_grad():
        for _ in range(20):
            model(x).sum().item()
    handle.remove()
    rec.close()
    points = agent.wait_points(20, timeout_s=20.0, model="mlp")
    assert all("gpu_ms" in p["fields"] and p["fields"]["gpu_ms"] > 0 for p in points), points[:2]
    assert all(p["fields"]["batch_size"] == 64 for p in points), points[:2]
    print("mlp gpu_ms median", statistics.median(p["fields"]["gpu_ms"] for p in points))


def test_client_cost_over_the_floor_with_real_events(agent: Agent) -> None:
    rec = edgewatch.Recorder(agent.udp_url, app="cuda-bench")

    class Noop:
        def __enter__(self) -> "Noop":
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def stage(self, name: str) -> "Noop":
            return self

        def gpu(self) -> "Noop":
            return self

    noop = Noop()

    def run(target: Any, n: int) -> List[int]:
        out = []
        perf = time.perf_counter_ns
        for _ in range(n):
            t0 = perf()
            with target.infer("bench", batch_size=4, input_length=640) if target is not noop else noop as t:
                with t.stage("preprocess"):
                    pass
                with t.gpu():
                    pass
                with t.stage("postprocess"):
                    pass
            out.append(perf() - t0)
        return out

    run(rec, 2000)
    floors, costs = [], []
    for _ in range(5):  # alternating rounds, so noise hits both alike
        floors.append(statistics.median(run(noop, 10000)) / 1000.0)
        costs.append(statistics.median(run(rec, 10000)) / 1000.0)
    floor, cost = statistics.median(floors), statistics.median(costs)
    # Where it goes: torch's own calls, timed alone on events already created (reused, as
    # the client's pool does), then a profile of the client's loop.
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2000)]
    for x in ev:
        x.record()  # creates each CUDA event (lazily, at its first record)
    torch.cuda.synchronize()

    def each(f: Any) -> float:
        t0 = time.perf_counter_ns()
        for x in ev:
            f(x)
        return (time.perf_counter_ns() - t0) / len(ev) / 1000.0

    rec_us = statistics.median(each(lambda x: x.record()) for _ in range(5))
    stream = torch.cuda.current_stream()
    rec_s_us = statistics.median(each(lambda x: x.record(stream)) for _ in range(5))
    cur_us = statistics.median(each(lambda x: torch.cuda.current_stream()) for _ in range(5))
    torch.cuda.synchronize()
    query_us = each(lambda x: x.query())
    own_us = cost - floor - 2 * rec_us
    print(
        f"floor {floor:.2f} µs, two stages + t.gpu() with CUDA events {cost:.2f} µs: "
        f"{cost - floor:.2f} µs over; torch's two Event.record() {2 * rec_us:.2f} µs of it "
        f"(each: current_stream() {cur_us:.2f} µs + record(stream) {rec_s_us:.2f} µs), "
        f"the client's own {own_us:.2f} µs; query() {query_us:.2f} µs (sender thread)"
    )
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    run(rec, 10000)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(14)
    rec.close()
    assert rec.stats()["gpu_timeouts"] == 0
    # The budget is for the client's own work; torch's record() is the application's
    # price for GPU time whoever calls it.
    assert own_us < 10.0, (floor, cost, rec_us)
