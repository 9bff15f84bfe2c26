"""The application is never slowed down or raised into: a full queue drops and counts in
microseconds while the sender is stalled; the agent being down or restarted raises nothing
and HTTP points recorded meanwhile arrive after the restart; 503 Retry-After is honoured;
close() never hangs on a stalled agent."""

from __future__ import annotations

import logging
import socket
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import pytest

import edgewatch
from edgewatch import _sender
from conftest import Agent


class StalledServer:
    """A TCP listener that accepts connections and never answers: the sender's HTTP write
    blocks in it until its timeout."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = threading.Event()
        self.conns: List[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            self.accepted.set()

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.fixture
def stalled() -> Iterator[StalledServer]:
    s = StalledServer()
    yield s
    s.close()


def test_full_queue_drops_and_counts_in_microseconds_while_the_sender_is_stalled(stalled: StalledServer) -> None:
    rec = edgewatch.Recorder(
        f"http://127.0.0.1:{stalled.port}", queue_size=100, batch_points=10, timeout=30, flush_interval=0.01
    )
    # The first point wakes the sender, which takes it and blocks in the stalled write.
    rec.record("m", wall_ms=1.0)
    assert stalled.accepted.wait(5), "the sender never connected"
    time.sleep(0.05)
    assert rec.stats()["queued"] == 1  # in flight, stuck
    for _ in range(100):  # fills the queue exactly
        assert rec.record("m", wall_ms=1.0)
    assert rec.stats()["dropped"] == 0
    durations: List[int] = []
    for _ in range(2000):
        t0 = time.perf_counter_ns()
        kept = rec.record("m", wall_ms=1.0)
        durations.append(time.perf_counter_ns() - t0)
        assert kept is False
    timed: List[int] = []
    for _ in range(2000):
        t0 = time.perf_counter_ns()
        with rec.infer("m", batch_size=1) as t:
            with t.stage("preprocess"):
                pass
        timed.append(time.perf_counter_ns() - t0)
    stats = rec.stats()
    assert stats["dropped"] == 4000, stats
    assert stats["queued"] == 101 and stats["sent"] == 0
    median_us = statistics.median(durations) / 1000
    p99_us = sorted(durations)[int(len(durations) * 0.99)] / 1000
    infer_median_us = statistics.median(timed) / 1000
    print(f"dropping record(): median {median_us:.2f} us, p99 {p99_us:.2f} us; infer+stage: median {infer_median_us:.2f} us")
    # Microseconds, not the 30 s the sender is blocked for (generous bounds for a busy CI).
    assert median_us < 50, durations[:20]
    assert p99_us < 2000
    assert infer_median_us < 100
    # close() gives up on the stalled write after its timeout; it does not wait 30 s.
    t0 = time.monotonic()
    rec.close(timeout=0.2)
    assert time.monotonic() - t0 < 3


def test_agent_down_then_restarted_never_raises_and_http_points_arrive(tmp_path) -> None:
    agent = Agent(tmp_path).start()
    rec = edgewatch.Recorder(agent.http_url, backoff=(0.05, 0.2), retry_timeout=60, flush_interval=0.02)
    udp = edgewatch.Recorder(agent.udp_url, flush_interval=0.02)
    try:
        rec.record("before", wall_ms=1.0)
        assert rec.flush(5)
        agent.kill()
        # Down: every call returns normally; HTTP keeps the points and retries.
        for i in range(20):
            with rec.infer("during", batch_size=1):
                pass
            with udp.infer("during_udp"):
                pass
            time.sleep(0.01)
        assert rec.flush(0.5) is False
        stats = rec.stats()
        assert stats["errors"] >= 1 and stats["queued"] == 20 and stats["dropped"] == 0, stats
        agent.start()  # same ports, same store
        assert rec.flush(10), rec.stats()
        assert len(agent.wait_points(20, model="during")) == 20
        assert len(agent.points(model="before")) == 1
        # UDP after the restart reaches the new process.
        udp.record("after_udp", wall_ms=2.0)
        assert udp.flush(5)
        agent.wait_points(1, model="after_udp")
        assert rec.stats()["dropped"] == 0
    finally:
        rec.close(timeout=1)
        udp.close(timeout=1)
        agent.kill()


def test_agent_never_there_raises_nothing_and_gives_up_after_retry_timeout() -> None:
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    addr = port.getsockname()[1]
    port.close()  # nothing listens there
    rec = edgewatch.Recorder(f"http://127.0.0.1:{addr}", backoff=(0.01, 0.02), retry_timeout=0.3, flush_interval=0.01)
    udp = edgewatch.Recorder(f"udp://127.0.0.1:{addr}", flush_interval=0.01)
    for _ in range(5):
        rec.record("m", wall_ms=1.0)
        with udp.infer("m"):
            pass
        time.sleep(0.02)
    assert rec.flush(5)  # given up after retry_timeout: nothing is left queued
    assert udp.flush(5)
    stats = rec.stats()
    assert stats["sent"] == 0 and stats["dropped"] == 5 and stats["errors"] >= 2, stats
    rec.close()
    udp.close()


class RetryAfterHandler(BaseHTTPRequestHandler):
    """Answers the first write 503 with Retry-After: 1, the next ones 204."""

    calls: List[Tuple[float, int]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        first = not self.calls
        self.calls.append((time.monotonic(), body.count(b"\n") + 1))
        if first:
            self.send_response(503)
            self.send_header("Retry-After", "1")
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self.send_response(204)
            self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_503_retry_after_is_honoured() -> None:
    # The real agent answers 503 only when its writer cannot keep up, which a test cannot
    # bring about on demand; this loopback server answers exactly like it.
    RetryAfterHandler.calls = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), RetryAfterHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        rec = edgewatch.Recorder(
            f"http://127.0.0.1:{server.server_address[1]}", backoff=(0.01, 0.02), flush_interval=0.01
        )
        for i in range(3):
            rec.record("m", wall_ms=float(i))
        assert rec.flush(5)
        calls = RetryAfterHandler.calls
        assert len(calls) == 2, calls
        waited = calls[1][0] - calls[0][0]
        # The backoff alone would have waited at most 0.02 s.
        assert 0.95 <= waited < 2.0, waited
        assert calls[1][1] == calls[0][1] == 3
        assert rec.stats()["sent"] == 3 and rec.stats()["errors"] == 1
        rec.close()
    finally:
        server.shutdown()
        server.server_close()


def test_recording_from_many_threads_loses_nothing(agent: Agent) -> None:
    rec = edgewatch.Recorder(agent.http_url, queue_size=100_000)

    def work(k: int) -> None:
        for i in range(250):
            with rec.infer(f"model{k}", batch_size=i) as t:
                with t.stage("preprocess"):
                    pass

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    rec.close(timeout=10)
    assert rec.stats()["sent"] == 2000
    assert len(agent.wait_points(2000)) == 2000


class ScriptedServer:
    """A loopback HTTP server standing in for a misbehaving proxy in front of the agent:
    answers each POST from ``answer(call_index, lines)`` (status and headers; 204 when it
    returns ``None``) and keeps ``(monotonic time, line count, status)`` per request."""

    def __init__(self, answer: Callable[[int, int], Optional[Tuple[int, Dict[str, str]]]]) -> None:
        self.calls: List[Tuple[float, int, int]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                lines = body.count(b"\n") + 1
                scripted = answer(len(server.calls), lines)
                status, headers = scripted if scripted is not None else (204, {})
                server.calls.append((time.monotonic(), lines, status))
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)  # latin-1 on the wire, as http.client reads it
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_retry_after_of_a_day_waits_only_the_rest_of_the_retry_budget() -> None:
    # Once: 503 "come back tomorrow", then 204. The sender tries again when its 1 s
    # retry budget ends (not in a day) and the batch goes through.
    once = ScriptedServer(lambda i, _: (503, {"Retry-After": "86400"}) if i == 0 else None)
    # Always: the batch is given up when the budget ends, and close() does not hang.
    always = ScriptedServer(lambda i, _: (503, {"Retry-After": "86400"}))
    try:
        rec = edgewatch.Recorder(once.url, backoff=(0.01, 0.02), retry_timeout=1.0, flush_interval=0.01)
        stuck = edgewatch.Recorder(always.url, backoff=(0.01, 0.02), retry_timeout=0.5, flush_interval=0.01)
        for i in range(3):
            rec.record("m", wall_ms=float(i))
            stuck.record("m", wall_ms=float(i))
        assert rec.flush(10), (rec.stats(), once.calls)
        assert stuck.flush(10), (stuck.stats(), always.calls)
        assert [c[1:] for c in once.calls] == [(3, 503), (3, 204)]
        waited = once.calls[1][0] - once.calls[0][0]
        assert 0.9 <= waited < 3.0, waited
        assert rec.stats()["sent"] == 3 and rec.stats()["dropped"] == 0, rec.stats()
        assert [c[1:] for c in always.calls] == [(3, 503), (3, 503)]
        gave_up_after = always.calls[1][0] - always.calls[0][0]
        assert 0.45 <= gave_up_after < 3.0, gave_up_after
        assert stuck.stats()["sent"] == 0 and stuck.stats()["dropped"] == 3, stuck.stats()
        rec.close(timeout=1)
        stuck.close(timeout=1)
    finally:
        once.close()
        always.close()


@pytest.mark.parametrize(
    "value",
    [
        "\u00b2",  # SUPERSCRIPT TWO: str.isdigit() is true and float() raises
        "\u00b9\u00b2\u00b3",
        "Sun, 06 Nov 1994 08:49:37 EST",  # not an HTTP-date (GMT only): not "retry at once"
        "1.5",
    ],
)
def test_an_unreadable_retry_after_falls_back_to_the_backoff(value: str, caplog: pytest.LogCaptureFixture) -> None:
    server = ScriptedServer(lambda i, _: (503, {"Retry-After": value}) if i < 2 else None)
    caplog.set_level(logging.WARNING, logger="edgewatch")
    try:
        rec = edgewatch.Recorder(server.url, backoff=(0.4, 0.8), retry_timeout=30, flush_interval=0.01)
        for i in range(3):
            rec.record("m", wall_ms=float(i))
        assert rec.flush(10), (rec.stats(), server.calls)
        assert [c[1:] for c in server.calls] == [(3, 503), (3, 503), (3, 204)]
        gaps = [b[0] - a[0] for a, b in zip(server.calls, server.calls[1:])]
        # The backoff waits 0.2-0.4 s, then 0.4-0.8 s (a crash in the parse retried at
        # the next flush_interval, 0.01 s, and never counted against the retry budget).
        assert gaps[0] >= 0.18 and gaps[1] >= 0.38 and sum(gaps) < 5, gaps
        stats = rec.stats()
        assert (stats["sent"], stats["dropped"], stats["errors"]) == (3, 0, 2), stats
        assert not [r for r in caplog.records if "step failed" in r.getMessage()], caplog.text
        rec.close(timeout=1)
    finally:
        server.close()


def test_the_batch_size_grows_back_after_a_413(monkeypatch: pytest.MonkeyPatch) -> None:
    # A proxy refuses bodies over 8 lines for a while (413), then is reconfigured. The
    # client halves its batches meanwhile and, once no 413 came for the hold time, goes
    # back to full batches of batch_points.
    monkeypatch.setattr(_sender, "_SPLIT_HOLD_S", 0.3, raising=False)
    limit = [8]
    server = ScriptedServer(lambda i, lines: (413, {}) if lines > limit[0] else None)
    try:
        rec = edgewatch.Recorder(server.url, batch_points=32, flush_interval=3600)
        for i in range(32):
            rec.record("m", wall_ms=float(i))
        assert rec.flush(10), (rec.stats(), server.calls)
        assert any(c[2] == 413 for c in server.calls), server.calls
        assert max(c[1] for c in server.calls if c[2] == 204) <= 8
        limit[0] = 1_000_000
        sent_before = len(server.calls)
        recorded = 32
        # Rounds of 32 points until one goes as one body (the sender may also wake at 16
        # queued points, so a round can go as two halves).
        deadline = time.monotonic() + 10
        while not any(c[1] == 32 for c in server.calls[sent_before:]):
            assert time.monotonic() < deadline, server.calls[sent_before:]
            for i in range(32):
                rec.record("m", wall_ms=float(i))
            recorded += 32
            assert rec.flush(10), (rec.stats(), server.calls)
            time.sleep(0.1)
        rec.close(timeout=5)
        stats = rec.stats()
        assert stats["sent"] == recorded and stats["dropped"] == 0, stats
        assert sum(c[1] for c in server.calls if c[2] == 204) == recorded
    finally:
        server.close()


class SlowEvent:
    """A CUDA event whose work completes 0.3 s after it is recorded: the sender polls the
    pending spans every ``gpu_poll_interval`` (5 ms), which must not make it send that
    often."""

    def __init__(self, enable_timing: bool = True) -> None:
        self.done_at: Optional[float] = None

    def record(self, stream: object = None) -> None:
        self.done_at = time.monotonic() + 0.3

    def query(self) -> bool:
        return self.done_at is not None and time.monotonic() >= self.done_at

    def elapsed_time(self, end: "SlowEvent") -> float:
        return 2.5


@pytest.mark.parametrize("gpu", [False, True])
def test_http_sends_at_most_once_a_second_by_default_and_flush_sends_at_once(gpu: bool) -> None:
    # Each HTTP request is a synced commit on the device: ten inferences a second go as
    # about one request a second, none held longer than the interval, and flush() does
    # not wait for the cadence. With GPU spans the sender wakes every poll interval to
    # read them; it still sends once a second.
    server = ScriptedServer(lambda i, _: None)
    try:
        rec = edgewatch.Recorder(server.url, gpu_events=SlowEvent if gpu else None)
        start = time.monotonic()
        for i in range(30):
            with rec.infer("m") as t:
                with t.gpu():
                    pass
            time.sleep(max(0.0, start + (i + 1) * 0.1 - time.monotonic()))
        deadline = time.monotonic() + 3
        while sum(c[1] for c in server.calls) < 30:
            assert time.monotonic() < deadline, server.calls
            time.sleep(0.02)
        sent_at = [c[0] for c in server.calls]
        assert 2 <= len(sent_at) <= 4, server.calls
        gaps = [b - a for a, b in zip(sent_at, sent_at[1:])]
        assert min(gaps) >= 0.9, gaps
        # The last point waited at most about one interval after it was recorded (and its
        # GPU work completed).
        assert sent_at[-1] - (start + 2.9) < (1.6 if gpu else 1.3), sent_at
        before = len(server.calls)
        t0 = time.monotonic()
        with rec.infer("m") as t:
            with t.gpu():
                pass
        assert rec.flush(5)
        assert len(server.calls) == before + 1 and server.calls[-1][0] - t0 < 0.5, server.calls
        rec.close(timeout=1)
    finally:
        server.close()
