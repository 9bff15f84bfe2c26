"""``rec.generate()``: the ``llm`` point and its ``itl_ms`` points as the real agent stores
them (exceptions, ``token(n)``, ``done``, the ``tokens_per_s`` formula), and the pure
gap arithmetic."""

from __future__ import annotations

import time

import pytest

import edgewatch
from edgewatch import _llm
from conftest import Agent


def split(points):
    """(the request points, the itl points) of one series, by time."""
    reqs = [p for p in points if "e2e_ms" in p["fields"]]
    itl = [p for p in points if "itl_ms" in p["fields"]]
    assert all(set(p["fields"]) == {"itl_ms"} for p in itl)
    return reqs, itl


def test_tokens_gaps_and_rate_as_stored(agent: Agent) -> None:
    rec = edgewatch.Recorder(agent.http_url, app="chat", tags={"site": "a"})
    t_wall0 = time.time_ns()
    with rec.generate("tiny-llm", prompt_tokens=12, server="vllm", queue_ms=1.5) as g:
        time.sleep(0.02)
        g.token()
        for _ in range(3):
            time.sleep(0.01)
            g.token()
        time.sleep(0.012)
        g.token(4)  # one chunk of four tokens: one gap worth gap / 4
    t_wall1 = time.time_ns()
    assert rec.flush(10)
    points = agent.wait_points(5, "llm", model="tiny-llm")
    assert len(points) == 5
    [req], itl = split(points)
    assert req["tags"] == {"model": "tiny-llm", "server": "vllm", "app": "chat", "site": "a"}
    f = req["fields"]
    assert f["prompt_tokens"] == 12 and f["queue_ms"] == 1.5
    assert f["output_tokens"] == 8 and f["tokens_counted"] is True and f["ok"] is True
    assert 20 <= f["ttft_ms"] < f["e2e_ms"] <= (t_wall1 - t_wall0) / 1e6
    assert f["tokens_per_s"] == pytest.approx(7 / ((f["e2e_ms"] - f["ttft_ms"]) / 1000))
    assert len(itl) == 4
    values = [p["fields"]["itl_ms"] for p in itl]
    assert all(v >= 10 for v in values[:3]), values
    assert 12 / 4 <= values[3] < 10, values  # the chunk of 4: gap / 4
    # Stamped at each later token's arrival: increasing, inside the request, before its end.
    stamps = [p["ts"] for p in itl]
    assert stamps == sorted(set(stamps))
    assert t_wall0 < stamps[0] and stamps[-1] < req["ts"] <= t_wall1
    covered = values[1] + values[2] + 4 * values[3]  # the first gap ends at stamps[0]
    assert (stamps[-1] - stamps[0]) / 1e6 == pytest.approx(covered, abs=0.001)
    rec.close()


def test_an_exception_is_ok_false_and_re_raised(agent: Agent) -> None:
    rec = edgewatch.Recorder(agent.http_url, app="chat")
    with pytest.raises(KeyError, match="boom"):
        with rec.generate("failing", server="ollama") as g:
            g.token()
            g.token()
            raise KeyError("boom")
    # No token and no exception: ok, but no ttft_ms nor rate.
    with rec.generate("empty", server="ollama"):
        pass
    assert rec.flush(10)
    [req], itl = split(agent.wait_points(2, "llm", model="failing"))
    assert req["fields"]["ok"] is False and req["fields"]["output_tokens"] == 2
    assert len(itl) == 1
    [empty] = agent.wait_points(1, "llm", model="empty")
    assert empty["fields"]["ok"] is True and empty["fields"]["output_tokens"] == 0
    assert "ttft_ms" not in empty["fields"] and "tokens_per_s" not in empty["fields"]
    rec.close()


def test_done_ends_early_and_reported_counts(agent: Agent) -> None:
    rec = edgewatch.Recorder(agent.http_url)
    with rec.generate("reported") as g:
        g.token()
        time.sleep(0.005)
        g.token()
        g.set(prompt_tokens=7)
        g.done(output_tokens=30)
        g.token()  # after done(): ignored
        time.sleep(0.05)
    assert rec.flush(10)
    [req], itl = split(agent.wait_points(2, "llm", model="reported"))
    f = req["fields"]
    assert f["output_tokens"] == 30 and f["tokens_counted"] is False and f["prompt_tokens"] == 7
    assert f["e2e_ms"] < 40  # ended at done(), not when the block ended
    assert f["tokens_per_s"] == pytest.approx(29 / ((f["e2e_ms"] - f["ttft_ms"]) / 1000))
    assert len(itl) == 1
    rec.close()


def test_one_token_has_no_rate_and_a_dropped_request_counts_all_its_points() -> None:
    assert _llm.decode_rate(1, 10.0, 5.0) is None
    assert _llm.decode_rate(5, 10.0, None) is None
    assert _llm.decode_rate(5, 10.0, 10.0) is None
    assert _llm.decode_rate(5, 10.0, 6.0) == pytest.approx(1000.0)
    rec = edgewatch.Recorder("udp://127.0.0.1:9", queue_size=1, flush_interval=60)
    rec._wake_at = 10**9  # the sender stays asleep: the queue stays full
    with rec.generate("a") as g:
        g.token()
    with rec.generate("b") as g:
        for _ in range(5):
            g.token()
    assert rec.stats()["dropped"] == 5  # the request and its four gaps
    rec.close(timeout=1)


def test_itl_points_ties_and_chunks() -> None:
    pts = list(_llm.itl_points([100, 200, 200, 500], [(3, 3)], 600, 10_000))
    assert [ts for ts, _ in pts] == [9_600, 9_601, 9_900]
    assert [v for _, v in pts] == pytest.approx([100e-6, 0.0, 100e-6])
    assert list(_llm.itl_points([5], None, 6, 100)) == []


def test_coarse_precision_keeps_every_gap() -> None:
    rec = edgewatch.Recorder("udp://127.0.0.1:9", precision="ms", flush_interval=60)
    submitted = []
    rec._submit_llm = lambda *args: submitted.append(args)  # type: ignore[method-assign]
    with rec.generate("fast") as g:
        for _ in range(4):
            g.token()  # microseconds apart: the same millisecond
    [(tags, fields, ts, readings, points)] = submitted
    assert points == 4
    pipeline = rec._pipeline
    pipeline._encode(("llm", tags, fields, ts, None, readings), None)
    lines, pipeline._ready = pipeline._ready, []
    stamps = [int(line.rsplit(" ", 1)[1]) for line in lines]
    assert len(lines) == 4 and stamps == sorted(set(stamps)), lines
    assert lines[-1].split(" ")[1].startswith("e2e_ms=")
    assert abs(stamps[0] - ts // 1_000_000) <= 1
    rec.close(timeout=1)
