"""``edgewatch.openai.instrument`` on the real ``openai`` client against a real
OpenAI-compatible server: ``transformers serve`` running a tiny random Llama built in
the test (no download), on a free loopback port; the points checked in the agent's store."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Iterator, List

import pytest

import edgewatch
from conftest import Agent, free_tcp_port, require
from test_llm import split
from tiny_llm import Server, build

MESSAGES = [{"role": "user", "content": "hello world"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("tiny-llm") / "model")


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    require("fastapi", "transformers[serving]")
    s = Server(model_dir, tmp_path_factory.mktemp("serve") / "serve.log").start()
    try:
        yield s
    finally:
        s.kill()


def client_for(base_url: str, rec: edgewatch.Recorder, **kw: Any) -> Any:
    openai = require("openai", "openai")
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)
    return edgewatch.openai.instrument(client, rec, **kw)


def is_content(chunk: Any) -> bool:
    return any(
        getattr(c, "text", None) or (getattr(c, "delta", None) is not None and c.delta.content)
        for c in chunk.choices
    )


def test_streamed_chat_matches_the_servers_usage_and_the_callers_clock(
    agent: Agent, server: Server, model_dir: Path
) -> None:
    rec = edgewatch.Recorder(agent.http_url, app="chat")
    client = client_for(server.base_url, rec)
    model = str(model_dir)
    t0 = time.perf_counter()
    stream = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=40, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    wall_ms = (time.perf_counter() - t0) * 1000
    usage = chunks[-1].usage  # asked for by the caller: handed on
    assert usage is not None and not chunks[-1].choices
    content = [c for c in chunks if is_content(c)]
    assert usage.completion_tokens == 40
    assert rec.flush(10)
    points = agent.wait_points(len(content), "llm", model=model)
    [req], itl = split(points)
    assert req["tags"] == {"model": model, "app": "chat", "server": f"127.0.0.1:{server.port}"}
    f = req["fields"]
    assert f["ok"] is True and f["tokens_counted"] is False
    assert f["output_tokens"] == usage.completion_tokens
    assert f["prompt_tokens"] == usage.prompt_tokens
    assert 0 < f["ttft_ms"] < f["e2e_ms"] <= wall_ms
    assert f["tokens_per_s"] == pytest.approx(39 / ((f["e2e_ms"] - f["ttft_ms"]) / 1000))
    # One gap per content chunk after the first; together they span first to last.
    assert len(itl) == len(content) - 1
    decode = f["e2e_ms"] - f["ttft_ms"]
    gaps = sum(p["fields"]["itl_ms"] for p in itl)
    assert gaps <= decode and decode - gaps < max(25.0, 0.2 * decode), (gaps, decode)
    rec.close()


def test_usage_is_asked_for_and_its_chunk_kept_from_the_caller(
    agent: Agent, server: Server, model_dir: Path
) -> None:
    rec = edgewatch.Recorder(agent.http_url)
    client = client_for(server.base_url, rec, server="transformers", tags={"pool": "a"})
    model = str(model_dir)
    chunks = list(client.completions.create(model=model, prompt="hello", max_tokens=12, stream=True))
    assert all(c.choices for c in chunks)  # no usage-only chunk: the caller did not ask
    content = [c for c in chunks if is_content(c)]
    # Without usage the content chunks are counted. The server samples, and its streamer
    # holds text back to a word boundary, so 9 tokens can arrive in fewer chunks: the
    # chunks the caller saw are what the client can count.
    second_content = [c for c in client.completions.create(
        model=model, prompt="the quick", max_tokens=9, stream=True,
        stream_options={"include_usage": False},
    ) if is_content(c)]
    assert 2 <= len(second_content) <= 9
    assert rec.flush(10)
    reqs, itl = split(agent.wait_points(
        len(content) + len(second_content), "llm", model=model, server="transformers"
    ))
    assert [r["tags"]["pool"] for r in reqs] == ["a", "a"]
    first, second = (r["fields"] for r in reqs)
    assert (first["output_tokens"], first["tokens_counted"]) == (12, False)
    assert first["prompt_tokens"] > 0
    assert (second["output_tokens"], second["tokens_counted"]) == (len(second_content), True)
    assert "prompt_tokens" not in second
    assert len(itl) == len(content) - 1 + len(second_content) - 1
    rec.close()


def test_not_streamed_records_usage_and_no_ttft(agent: Agent, server: Server, model_dir: Path) -> None:
    rec = edgewatch.Recorder(agent.http_url)
    client = client_for(server.base_url, rec)
    model = str(model_dir)
    t0 = time.perf_counter()
    reply = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=15)
    wall_ms = (time.perf_counter() - t0) * 1000
    text = client.completions.create(model=model, prompt="hello", max_tokens=5)
    assert rec.flush(10)
    reqs, itl = split(agent.wait_points(2, "llm", model=model))
    assert itl == []
    chat, completion = (r["fields"] for r in reqs)
    assert chat["output_tokens"] == reply.usage.completion_tokens == 15
    assert chat["prompt_tokens"] == reply.usage.prompt_tokens
    assert chat["tokens_counted"] is False and chat["ok"] is True
    assert 0 < chat["e2e_ms"] <= wall_ms
    assert "ttft_ms" not in chat and "tokens_per_s" not in chat
    assert completion["output_tokens"] == text.usage.completion_tokens == 5
    rec.close()


def test_a_stream_closed_or_dropped_early_is_not_ok(agent: Agent, server: Server, model_dir: Path) -> None:
    rec = edgewatch.Recorder(agent.http_url)
    client = client_for(server.base_url, rec)
    model = str(model_dir)
    stream = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=200, stream=True)
    seen = 0
    for chunk in stream:
        seen += is_content(chunk)
        if seen == 3:
            break
    stream.close()

    def dropped() -> None:
        for chunk in client.completions.create(model=model, prompt="hello", max_tokens=200, stream=True):
            if is_content(chunk):
                break  # the stream is dropped here, unclosed

    dropped()
    assert rec.flush(10)
    reqs, itl = split(agent.wait_points(2 + 2, "llm", model=model))
    assert [r["fields"]["ok"] for r in reqs] == [False, False]
    assert [r["fields"]["output_tokens"] for r in reqs] == [3, 1]
    assert all(r["fields"]["tokens_counted"] for r in reqs)
    assert len(itl) == 2
    rec.close()


def test_a_stream_cut_by_the_server_dying_is_not_ok(
    agent: Agent, model_dir: Path, tmp_path: Path
) -> None:
    openai = require("openai", "openai")
    doomed = Server(model_dir, tmp_path / "doomed.log").start()
    rec = edgewatch.Recorder(agent.http_url)
    client = client_for(doomed.base_url, rec)
    model = str(model_dir)
    seen = 0
    raised: List[BaseException] = []
    try:
        stream = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=1500, stream=True)
        try:
            for chunk in stream:
                seen += is_content(chunk)
                if seen == 5:
                    doomed.kill()  # SIGKILL mid-generation: the connection is cut
        except Exception as e:
            raised.append(e)
    finally:
        doomed.kill()
    assert seen < 1500
    # The stream ended early: either the client raised (an openai error, as without
    # edgewatch) or the body just stopped; both are ok=false.
    assert all(isinstance(e, openai.APIError) for e in raised), raised
    assert rec.flush(10)
    points = agent.wait_points(seen, "llm", model=model)
    [req], itl = split(points)
    assert req["fields"]["ok"] is False
    assert req["fields"]["output_tokens"] == seen
    assert len(itl) == seen - 1
    rec.close()


def test_server_down_raises_the_openai_error_only_and_records_it(
    agent: Agent, model_dir: Path
) -> None:
    openai = require("openai", "openai")
    rec = edgewatch.Recorder(agent.http_url)
    down = f"http://127.0.0.1:{free_tcp_port()}/v1"
    client = client_for(down, rec, server="vllm")
    with pytest.raises(openai.APIConnectionError):
        client.chat.completions.create(model="gone", messages=MESSAGES, max_tokens=5)
    with pytest.raises(openai.APIConnectionError):
        client.completions.create(model="gone", prompt="x", max_tokens=5, stream=True)
    assert rec.flush(10)
    reqs, itl = split(agent.wait_points(2, "llm", model="gone"))
    assert itl == []
    for r in reqs:
        assert r["fields"]["ok"] is False and "ttft_ms" not in r["fields"]
        assert r["tags"]["server"] == "vllm"
    rec.close()


def test_async_client_streamed(agent: Agent, server: Server, model_dir: Path) -> None:
    openai = require("openai", "openai")
    rec = edgewatch.Recorder(agent.http_url)
    client = edgewatch.openai.instrument(
        openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0), rec
    )
    model = str(model_dir)

    async def run() -> int:
        n = 0
        stream = await client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=10, stream=True)
        async for chunk in stream:
            n += is_content(chunk)
        reply = await client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4)
        assert reply.usage.completion_tokens == 4
        await client.close()
        return n

    content = asyncio.run(run())
    assert rec.flush(10)
    reqs, itl = split(agent.wait_points(content + 1, "llm", model=model))
    streamed, plain = (r["fields"] for r in reqs)
    assert (streamed["output_tokens"], streamed["tokens_counted"], streamed["ok"]) == (10, False, True)
    assert streamed["ttft_ms"] < streamed["e2e_ms"]
    assert len(itl) == content - 1
    assert plain["output_tokens"] == 4 and "ttft_ms" not in plain
    rec.close()


def test_instrumenting_imports_nothing_and_uninstrument_restores() -> None:
    openai = require("openai", "openai")
    client = openai.OpenAI(base_url="http://127.0.0.1:1/v1", api_key="unused")
    before = client.chat.completions.create
    rec = edgewatch.Recorder("udp://127.0.0.1:9")
    edgewatch.openai.instrument(client, rec)
    edgewatch.openai.instrument(client, rec)  # twice: still one wrapper
    assert client.chat.completions.create.__wrapped__ == before
    edgewatch.openai.uninstrument(client)
    assert client.chat.completions.create == before
    assert edgewatch.openai.server_name(client) == "127.0.0.1:1"
    rec.close(timeout=1)

