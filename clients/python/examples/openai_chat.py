"""LLM serving latency from the caller's side: time to first token, inter-token gaps and
tokens per second of every request an OpenAI-compatible server (vLLM, llama.cpp's
llama-server, Ollama, `transformers serve`...) answers, with one line added to the app.

    python3 openai_chat.py http://127.0.0.1:8000/v1 MODEL [udp://127.0.0.1:8089]

Each request becomes one `llm` point (ttft_ms, e2e_ms, prompt_tokens, output_tokens,
tokens_per_s, ok) tagged model, server (the base URL's host:port) and app, plus one
`llm` point per inter-token gap (itl_ms).
"""

import sys

import openai

import edgewatch
import edgewatch.openai

base_url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/v1"
model = sys.argv[2] if len(sys.argv) > 2 else "default"
agent = sys.argv[3] if len(sys.argv) > 3 else "udp://127.0.0.1:8089"

rec = edgewatch.Recorder(agent, app="assistant")
client = edgewatch.openai.instrument(openai.OpenAI(base_url=base_url, api_key="none"), rec)

# Streamed: TTFT and gaps per chunk, token counts from the server's usage.
stream = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Name three rivers."}],
    max_tokens=64,
    stream=True,
)
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        print(chunk.choices[0].delta.content, end="", flush=True)
print()

# Not streamed: e2e_ms and the usage counts.
reply = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "And three lakes?"}], max_tokens=64
)
print(reply.choices[0].message.content)

# Timing any other client by hand: one g.token() per token (or chunk) received.
with rec.generate(model, prompt_tokens=5, server="custom") as g:
    for piece in ["a", "b", "c"]:
        g.token()

print(rec.stats())
rec.close()
