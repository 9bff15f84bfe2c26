"""What instrumenting an inference costs the application, against the real agent.

1. Per-record overhead: ``with rec.infer(...)`` with two stages, over UDP and over HTTP
   (median and p99 of the time the application's thread spends, minus an empty loop), side
   by side with writing the same point synchronously through ``influxdb-client``.
2. Added latency on a ~1 ms onnxruntime model (CPU, one thread): p50/p99 of a bare
   ``session.run`` loop against the same loop timed with ``rec.infer`` and two stages,
   and against the same loop writing each point synchronously with ``influxdb-client``;
   the variants run in rounds, one run each in a random order, so that machine noise
   hits them alike.

Usage (from the repository root, after ``cargo build``):

    python3 clients/python/bench/bench_overhead.py --bin target/debug/edgewatch

Needs onnx, onnxruntime, numpy and influxdb-client (``pip install onnx onnxruntime
influxdb-client``). Prints Markdown tables. The second bare variant is the same loop as
the first: the gap between the two is the machine's noise, against which the others read.
On a shared machine, ``nice -n -20`` keeps other processes from preempting the loop.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

import edgewatch  # noqa: E402


def free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_agent(binary: str, workdir: Path) -> tuple[subprocess.Popen[bytes], int, int]:
    http, udp = free_port(socket.SOCK_STREAM), free_port(socket.SOCK_DGRAM)
    cfg = workdir / "edgewatch.toml"
    cfg.write_text(
        f'[http]\nlisten = "127.0.0.1:{http}"\n[udp]\nlisten = "127.0.0.1:{udp}"\n'
        f'[storage]\ndata_dir = "{workdir / "data"}"\n'
        "[health]\nenabled = false\n[host]\nenabled = false\n[tegrastats]\nenabled = false\n"
        "[jetson]\nenabled = false\n[nvml]\nenabled = false\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEWATCH_")}
    proc = subprocess.Popen(
        [binary, "run", "--config", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    for _ in range(500):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/health", timeout=1) as r:
                if r.status == 200:
                    return proc, http, udp
        except OSError:
            time.sleep(0.02)
    proc.kill()
    raise SystemExit("the agent did not start")


def percentiles(ns: List[int]) -> Dict[str, float]:
    s = sorted(ns)
    return {
        "p50": statistics.median(s) / 1000.0,
        "p99": s[min(len(s) - 1, int(len(s) * 0.99))] / 1000.0,
    }


def time_loop(n: int, body: Callable[[int], None]) -> List[int]:
    out = []
    perf = time.perf_counter_ns
    for i in range(n):
        t0 = perf()
        body(i)
        out.append(perf() - t0)
    return out


def record_overhead(n: int, http: int, udp: int) -> Dict[str, Dict[str, float]]:
    if not os.environ.get("BENCH_NO_INFLUX"):
        from influxdb_client import InfluxDBClient, Point
        from influxdb_client.client.write_api import SYNCHRONOUS

    results: Dict[str, Dict[str, float]] = {}
    empty = percentiles(time_loop(n, lambda i: None))
    results["empty loop"] = empty

    def two_stages(rec: edgewatch.Recorder) -> Callable[[int], None]:
        def body(i: int) -> None:
            with rec.infer("bench", batch_size=4, input_length=640) as t:
                with t.stage("preprocess"):
                    pass
                with t.stage("postprocess"):
                    pass

        return body

    class Noop:
        """A context manager doing nothing: the floor of the same ``with`` blocks."""

        def __enter__(self) -> "Noop":
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def stage(self, name: str) -> "Noop":
            return self

        def gpu(self) -> "Noop":
            return self

    noop = Noop()

    def with_gpu(rec: Any) -> Callable[[int], None]:
        def body(i: int) -> None:
            with rec.infer("bench", batch_size=4, input_length=640) as t:
                with t.stage("preprocess"):
                    pass
                with t.gpu():
                    pass
                with t.stage("postprocess"):
                    pass

        return body

    class NoopRecorder:
        def infer(self, model: str, **kw: object) -> Noop:
            return noop

    floor = percentiles(time_loop(n, with_gpu(NoopRecorder())))
    results["floor: the same with blocks doing nothing"] = floor

    for name, url in (("edgewatch, UDP", f"udp://127.0.0.1:{udp}"), ("edgewatch, HTTP", f"http://127.0.0.1:{http}")):
        rec = edgewatch.Recorder(url, app="bench", queue_size=max(10_000, n))
        time_loop(min(n, 2000), two_stages(rec))  # warm up
        results[name] = percentiles(time_loop(n, two_stages(rec)))
        rec.close(timeout=30)
        results[name]["sent"] = rec.stats()["sent"]
    rec = edgewatch.Recorder(f"udp://127.0.0.1:{udp}", app="bench", queue_size=max(10_000, n))
    time_loop(min(n, 2000), with_gpu(rec))
    gpu_name = "edgewatch, UDP, two stages + t.gpu()" + ("" if rec._clock.event() is not None else " (no CUDA here)")
    results[gpu_name] = percentiles(time_loop(n, with_gpu(rec)))
    results[gpu_name]["net of the floor"] = results[gpu_name]["p50"] - floor["p50"]
    rec.close(timeout=30)

    if os.environ.get("BENCH_NO_INFLUX"):
        for k, v in results.items():
            if k != "empty loop":
                v["p50 net"] = v["p50"] - empty["p50"]
        return results
    with InfluxDBClient(url=f"http://127.0.0.1:{http}", token="unused", org="unused") as client:
        write = client.write_api(write_options=SYNCHRONOUS)

        def influx(i: int) -> None:
            t0 = time.perf_counter_ns()
            pre = (time.perf_counter_ns() - t0) / 1e6
            post = (time.perf_counter_ns() - t0) / 1e6
            write.write(
                bucket="edge",
                record=Point("inference").tag("model", "bench").tag("app", "bench")
                .field("wall_ms", post).field("preprocess_ms", pre).field("postprocess_ms", post)
                .field("batch_size", 4).field("input_length", 640).field("ok", True),
            )

        m = min(n, 3000)
        time_loop(200, influx)
        results["influxdb-client, SYNCHRONOUS"] = percentiles(time_loop(m, influx))
    for k, v in results.items():
        if k != "empty loop":
            v["p50 net"] = v["p50"] - empty["p50"]
    return results


LOAD_BEFORE = ""
WIDTH, BATCH = 256, 64  # 256 KB of weights per layer: stays in cache, compute-bound


def onnx_model(layers: int, width: int, batch: int) -> Any:
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        w = numpy_helper.from_array((rng.standard_normal((width, width)) / width).astype(np.float32), f"W{i}")
        inits.append(w)
        nodes.append(helper.make_node("MatMul", [prev, f"W{i}"], [f"h{i}"]))
        nodes.append(helper.make_node("Relu", [f"h{i}"], [f"r{i}"]))
        prev = f"r{i}"
    graph = helper.make_graph(
        nodes, "bench",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [batch, width])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def model_latency(rounds: int, http: int, udp: int) -> Dict[str, Dict[str, float]]:
    import numpy as np
    if not os.environ.get("BENCH_NO_INFLUX"):
        from influxdb_client import InfluxDBClient, Point
        from influxdb_client.client.write_api import SYNCHRONOUS

    width, batch = WIDTH, BATCH
    frame = np.ones((batch, width), dtype=np.float32)
    # Size the model to ~1 ms on this machine (median of a bare run).
    for layers in range(1, 64):
        session = onnx_model(layers, width, batch)
        for _ in range(20):
            session.run(None, {"x": frame})
        t = statistics.median(time_loop(200, lambda i: session.run(None, {"x": frame})))
        if t >= 1_000_000:
            break

    def bare(i: int) -> None:
        x = frame * 1.0
        y = session.run(None, {"x": x})[0]
        y.argmax(axis=1)

    def timed(rec: edgewatch.Recorder) -> Callable[[int], None]:
        def body(i: int) -> None:
            with rec.infer("bench_onnx", batch_size=batch, input_length=width) as t:
                with t.stage("preprocess"):
                    x = frame * 1.0
                y = session.run(None, {"x": x})[0]
                with t.stage("postprocess"):
                    y.argmax(axis=1)

        return body

    udp_rec = edgewatch.Recorder(f"udp://127.0.0.1:{udp}", app="bench", queue_size=100_000)
    # The hot path alone: a recorder whose sender never wakes during the runs (its queue
    # only grows), to tell the calling thread's cost from the sender thread's.
    idle_rec = edgewatch.Recorder(
        f"udp://127.0.0.1:{udp}", app="bench", queue_size=100_000, flush_interval=3600, batch_points=1_000_000
    )
    http_rec = edgewatch.Recorder(f"http://127.0.0.1:{http}", app="bench", queue_size=100_000)
    client = InfluxDBClient(url=f"http://127.0.0.1:{http}", token="unused", org="unused")
    write = client.write_api(write_options=SYNCHRONOUS)

    def influx(i: int) -> None:
        t0 = time.perf_counter_ns()
        x = frame * 1.0
        t1 = time.perf_counter_ns()
        y = session.run(None, {"x": x})[0]
        t2 = time.perf_counter_ns()
        y.argmax(axis=1)
        t3 = time.perf_counter_ns()
        write.write(
            bucket="edge",
            record=Point("inference").tag("model", "bench_influx").tag("app", "bench")
            .field("wall_ms", (t3 - t0) / 1e6).field("preprocess_ms", (t1 - t0) / 1e6)
            .field("postprocess_ms", (t3 - t2) / 1e6).field("batch_size", batch)
            .field("input_length", width).field("ok", True),
        )

    variants: Dict[str, Callable[[int], None]] = {
        "bare session.run": bare,
        "bare session.run, again (the noise band)": bare,
        "edgewatch, UDP": timed(udp_rec),
        "edgewatch, HTTP": timed(http_rec),
        "edgewatch, sender idle (the calling thread's part)": timed(idle_rec),
        "influxdb-client, SYNCHRONOUS": influx,
    }
    wall: Dict[str, List[int]] = {k: [] for k in variants}
    cpu: Dict[str, List[int]] = {k: [] for k in variants}
    for body in variants.values():
        time_loop(100, body)  # warm up
    # Rounds of one run of each variant, in a new random order every round: the machine's
    # noise, and the agent's commit after a synchronous write (which slows whatever runs
    # next), hit all variants alike.
    # Wall time is what the caller waits; the calling thread's CPU time (ONNX Runtime with
    # one thread computes in it) is the same work without the time other processes took.
    names = list(variants)
    perf, thread_cpu = time.perf_counter_ns, time.thread_time_ns
    order = random.Random(0)
    for r in range(rounds):
        shuffled = names[:]
        order.shuffle(shuffled)
        for name in shuffled:
            body = variants[name]
            c0, t0 = thread_cpu(), perf()
            body(r)
            t1, c1 = perf(), thread_cpu()
            wall[name].append(t1 - t0)
            cpu[name].append(c1 - c0)
    udp_rec.flush(30)
    http_rec.flush(30)
    out: Dict[str, Dict[str, float]] = {}
    base_w, base_c = percentiles(wall[names[0]]), percentiles(cpu[names[0]])
    for k in names:
        w, c = percentiles(wall[k]), percentiles(cpu[k])
        out[k] = {
            "p50": w["p50"], "p99": w["p99"], "cpu p50": c["p50"], "cpu p99": c["p99"],
            "added p50 %": 100.0 * (w["p50"] - base_w["p50"]) / base_w["p50"],
            "added p99 %": 100.0 * (w["p99"] - base_w["p99"]) / base_w["p99"],
            "added cpu p50 %": 100.0 * (c["p50"] - base_c["p50"]) / base_c["p50"],
            "added cpu p99 %": 100.0 * (c["p99"] - base_c["p99"]) / base_c["p99"],
        }
    # The sender thread's CPU per point, from the kernel's per-thread CPU time
    # (/proc/self/task/TID/schedstat, ns), over a run of instrumented inferences, flushed.
    def thread_cpu_ns(tid: int) -> int:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            return int(f.read().split()[0])

    for name, rec in (("edgewatch, UDP", udp_rec), ("edgewatch, HTTP", http_rec)):
        body = variants[name]
        tid = rec._pipeline._thread.native_id
        assert tid is not None
        n = min(rounds, 2000)
        s0 = thread_cpu_ns(tid)
        for i in range(n):
            body(i)
        rec.flush(30)
        out[name]["sender cpu us/point"] = (thread_cpu_ns(tid) - s0) / n / 1000.0
    udp_rec.close(timeout=30)
    http_rec.close(timeout=30)
    idle_rec.close(timeout=30)
    client.close()
    out[names[0]]["layers"] = layers
    out["edgewatch, UDP"]["sent"] = udp_rec.stats()["sent"]
    out["edgewatch, HTTP"]["sent"] = http_rec.stats()["sent"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", default=os.environ.get("EDGEWATCH_BIN", "target/debug/edgewatch"))
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3000)
    args = parser.parse_args()
    global LOAD_BEFORE
    LOAD_BEFORE = f"{os.getloadavg()[0]:.2f}"
    with tempfile.TemporaryDirectory(prefix="edgewatch-bench-") as tmp:
        proc, http, udp = start_agent(args.bin, Path(tmp))
        try:
            rec = record_overhead(args.records, http, udp)
            model = model_latency(args.rounds, http, udp) if args.rounds else {}
        finally:
            proc.terminate()
            proc.wait(30)
    print(f"\n### Per record ({args.records} records; influxdb-client: {min(args.records, 3000)})\n")
    print("| writer | median µs | p99 µs | median µs, net of the empty loop |")
    print("|---|---|---|---|")
    for k, v in rec.items():
        if k == "empty loop":
            continue
        print(f"| {k} | {v['p50']:.2f} | {v['p99']:.2f} | {v['p50 net']:.2f} |")
    print(f"\n(empty loop: median {rec['empty loop']['p50']:.2f} µs)")
    for k, v in rec.items():
        if "net of the floor" in v:
            print(f"{k}: {v['net of the floor']:.2f} µs median over the floor (the same with blocks doing nothing)")
    if not model:
        return
    layers = int(model["bare session.run"]["layers"])
    print(f"\n### ~1 ms onnxruntime model ({layers} x (MatMul {BATCH}x{WIDTH}x{WIDTH} + Relu), 1 thread; "
          f"{args.rounds} runs per variant in random order)\n")
    print("| variant | wall p50 µs | wall p99 µs | added wall p50 | added wall p99 "
          "| CPU p50 µs | CPU p99 µs | added CPU p50 | added CPU p99 | sender CPU µs/point |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for k, v in model.items():
        sender = v.get("sender cpu us/point")
        print(f"| {k} | {v['p50']:.1f} | {v['p99']:.1f} | {v['added p50 %']:+.2f} % | {v['added p99 %']:+.2f} % "
              f"| {v['cpu p50']:.1f} | {v['cpu p99']:.1f} | {v['added cpu p50 %']:+.2f} % | {v['added cpu p99 %']:+.2f} % "
              f"| {'' if sender is None else f'{sender:.2f}'} |")
    print(f"\n(load average before: {LOAD_BEFORE}; after: {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
