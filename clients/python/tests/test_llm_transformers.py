"""``edgewatch.transformers.Streamer`` on a real in-process ``model.generate`` of a tiny
random Llama (built in the test, no download): exact token counts, one gap per step."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import edgewatch
from conftest import Agent, require
from test_llm import split
from tiny_llm import build


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Any:
    transformers = require("transformers", "transformers[serving]")
    path = build(tmp_path_factory.mktemp("tiny-llm") / "model")
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    return tok, model


def test_streamer_counts_exactly_and_times_each_step(agent: Agent, tiny: Any) -> None:
    tok, model = tiny
    rec = edgewatch.Recorder(agent.http_url, app="local")
    inputs = tok("hello world this is", return_tensors="pt")
    prompt = int(inputs["input_ids"].shape[-1])
    streamer = edgewatch.transformers.Streamer(rec, "tiny")
    t0 = time.perf_counter()
    out = model.generate(**inputs, max_new_tokens=24, do_sample=False, streamer=streamer)
    wall_ms = (time.perf_counter() - t0) * 1000
    generated = int(out.shape[-1]) - prompt
    # Reused for a second call: a second point.
    model.generate(**inputs, max_new_tokens=6, do_sample=True, streamer=streamer)
    assert rec.flush(10)
    reqs, itl = split(agent.wait_points(24 + 6, "llm", model="tiny"))
    first, second = (r["fields"] for r in reqs)
    assert reqs[0]["tags"] == {"model": "tiny", "server": "transformers", "app": "local"}
    assert first["output_tokens"] == generated == 24 and first["tokens_counted"] is True
    assert first["prompt_tokens"] == prompt and first["ok"] is True
    assert 0 < first["ttft_ms"] < first["e2e_ms"] <= wall_ms
    assert second["output_tokens"] == 6
    first_itl = [p for p in itl if p["ts"] < reqs[0]["ts"]]
    assert len(first_itl) == 24 - 1 and len(itl) == 23 + 5
    decode = first["e2e_ms"] - first["ttft_ms"]
    gaps = sum(p["fields"]["itl_ms"] for p in first_itl)
    assert gaps <= decode and gaps == pytest.approx(decode, rel=0.1, abs=2.0)
    rec.close()


def test_streamer_inside_generate_records_an_exception(agent: Agent, tiny: Any) -> None:
    tok, model = tiny
    rec = edgewatch.Recorder(agent.http_url)
    inputs = tok("hello", return_tensors="pt")

    class Boom(Exception):
        pass

    class StopAfter:
        """A second streamer, chained with then=: raises at the fourth token."""

        def __init__(self) -> None:
            self.puts = 0

        def put(self, value: Any) -> None:
            self.puts += 1
            if self.puts == 5:  # the prompt, then four tokens
                raise Boom()

        def end(self) -> None:
            pass

    with pytest.raises(Boom):
        with rec.generate("tiny-fails", server="transformers") as g:
            model.generate(
                **inputs, max_new_tokens=20, streamer=edgewatch.transformers.Streamer(g, then=StopAfter())
            )
    assert rec.flush(10)
    [req], itl = split(agent.wait_points(4, "llm", model="tiny-fails"))
    assert req["fields"]["ok"] is False and req["fields"]["output_tokens"] == 4
    assert req["fields"]["prompt_tokens"] == int(inputs["input_ids"].shape[-1])
    assert len(itl) == 3
    rec.close()
