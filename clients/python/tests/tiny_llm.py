"""A tiny random causal LM and its tokenizer, built locally (no download), and a real
``transformers serve`` process serving it on a free loopback port.

The tokenizer is a byte-level BPE trained on a few sentences, with only the characters
of those sentences as its alphabet, so that every token decodes to complete text (the
server then streams one token per chunk). The model is a 2-layer Llama with random
weights whose output row for the end-of-sequence token is zero and whose other rows are
scaled up: it never picks EOS, so a request generates exactly ``max_tokens`` tokens.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Optional

from conftest import free_tcp_port, http_get, require, wait_for

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world this is a tiny model on an edge device",
    "latency of the first token and of every token after it",
    "user assistant system message",
]


def build(out: Path) -> Path:
    """Writes the tokenizer and the model to ``out``; returns it."""
    torch = require("torch", "torch")
    tokenizers = require("tokenizers", "tokenizers")
    transformers = require("transformers", "transformers[serving]")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    out.mkdir(parents=True, exist_ok=True)
    tok = tokenizers.Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=["<s>", "</s>", "<pad>"])
    tok.train_from_iterator(CORPUS * 10, trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    fast.save_pretrained(out)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(fast),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
        model.lm_head.weight[fast.eos_token_id].zero_()
    model.save_pretrained(out)
    return out


class Server:
    """``transformers serve MODEL`` on a free 127.0.0.1 port, offline, stopped by PID."""

    def __init__(self, model_dir: Path, log: Path) -> None:
        self.model_dir = model_dir
        self.port = free_tcp_port()
        self.log = log
        self.proc: Optional[subprocess.Popen[bytes]] = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> "Server":
        import pytest

        code = "import sys; from transformers.cli.transformers import main; sys.argv[0] = 'transformers'; sys.exit(main())"
        env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEWATCH_")}
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(self.log.parent / "hf"))
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code, "serve", str(self.model_dir), "--host", "127.0.0.1",
                 "--port", str(self.port), "--device", "cpu", "--log-level", "warning"],
                stdout=log, stderr=log, env=env,
            )

        def ready() -> Optional[bool]:
            assert self.proc is not None
            if self.proc.poll() is not None:
                pytest.fail(f"transformers serve exited early ({self.proc.returncode}):\n{self.log.read_text()}")
            try:
                return True if http_get(f"http://127.0.0.1:{self.port}/health", 1.0)[0] == 200 else None
            except OSError:
                return None

        if wait_for(120.0, ready, every_s=0.2) is None:
            self.kill()
            pytest.fail(f"transformers serve did not become ready:\n{self.log.read_text()}")
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None
