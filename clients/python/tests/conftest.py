"""Test support: the real edgewatch agent on free loopback ports, started from a config file
in a temp dir and stopped by PID, and its JSON query API read back.

The agent binary comes from ``EDGEWATCH_BIN`` (``scripts/test.sh`` builds it and sets it),
else ``target/debug/edgewatch`` at the repository root. A missing binary or a missing
PyPI peer (pytest, onnx, onnxruntime, torch) fails the run naming what to install.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, TypeVar

import pytest

REPO = Path(__file__).resolve().parents[3]
T = TypeVar("T")


def require(module: str, package: str) -> Any:
    """Imports ``module`` or fails naming the PyPI package to install (never skips)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        pytest.fail(
            f"the PyPI package {package!r} is needed for this test ({e}); "
            f"install it: python3 -m pip install {package}",
            pytrace=False,
        )


def agent_bin() -> Path:
    path = Path(os.environ.get("EDGEWATCH_BIN", REPO / "target" / "debug" / "edgewatch"))
    if not path.is_file():
        pytest.fail(
            f"edgewatch agent binary not found at {path}: run `cargo build` and set "
            "EDGEWATCH_BIN=target/debug/edgewatch (scripts/test.sh does both)",
            pytrace=False,
        )
    return path


def free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(timeout_s: float, check: Callable[[], Optional[T]], every_s: float = 0.02) -> Optional[T]:
    """Polls ``check`` until it returns something other than ``None`` or time runs out."""
    end = time.monotonic() + timeout_s
    while True:
        value = check()
        if value is not None:
            return value
        if time.monotonic() > end:
            return None
        time.sleep(every_s)


def http_get(url: str, timeout_s: float = 5.0) -> Tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return int(r.status), r.read()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read()


class Agent:
    """One ``edgewatch run`` on free ports with its own data dir; collectors off, so the
    store holds only what the tests write."""

    def __init__(self, workdir: Path, token: str = "", extra_config: str = "") -> None:
        self.workdir = workdir
        self.token = token
        self.http_port = free_tcp_port()
        self.udp_port = free_udp_port()
        self.config = workdir / "edgewatch.toml"
        self.config.write_text(
            f"""[http]
listen = "127.0.0.1:{self.http_port}"
token = "{token}"
[udp]
listen = "127.0.0.1:{self.udp_port}"
[storage]
data_dir = "{workdir / 'data'}"
[health]
enabled = false
[kmsg]
enabled = false
[host]
enabled = false
[tegrastats]
enabled = false
[jetson]
enabled = false
[nvml]
enabled = false
{extra_config}
"""
        )
        self.log = workdir / "agent.log"
        self.proc: Optional[subprocess.Popen[bytes]] = None

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def udp_url(self) -> str:
        return f"udp://127.0.0.1:{self.udp_port}"

    def start(self) -> "Agent":
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [str(agent_bin()), "run", "--config", str(self.config)],
                stdout=subprocess.DEVNULL,
                stderr=log,
                # The agent reads EDGEWATCH_* as config overrides (and refuses unknown
                # ones, such as EDGEWATCH_BIN): it gets none of the caller's.
                env={
                    **{k: v for k, v in os.environ.items() if not k.startswith("EDGEWATCH_")},
                    "RUST_LOG": "info",
                },
            )

        def ready() -> Optional[bool]:
            assert self.proc is not None
            if self.proc.poll() is not None:
                pytest.fail(f"edgewatch exited early ({self.proc.returncode}):\n{self.log.read_text()}")
            try:
                return True if http_get(self.http_url + "/health", 1.0)[0] == 200 else None
            except OSError:
                return None

        if wait_for(20.0, ready) is None:
            pytest.fail(f"edgewatch did not become ready:\n{self.log.read_text()}")
        return self

    def kill(self) -> None:
        """SIGKILL, as a crash would; waits for the exit."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        """SIGTERM (the agent flushes its queue) and wait."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def status(self) -> Dict[str, Any]:
        code, body = http_get(self.http_url + "/api/v1/status")
        assert code == 200, body
        return dict(json.loads(body))

    def points(self, measurement: str = "inference", **tags: str) -> List[Dict[str, Any]]:
        """Every stored point of ``measurement`` (filtered by tags) as one dict per series
        tag set and timestamp: ``{"tags": {...}, "ts": ns, "fields": {...}}``, by time."""
        query = f"measurement={measurement}&from=0&to=4000000000000000000"
        for k, v in tags.items():
            query += f"&tag.{k}={urllib.request.quote(v)}"
        code, body = http_get(f"{self.http_url}/api/v1/query?{query}")
        assert code == 200, body
        doc = json.loads(body)
        rows: Dict[Tuple[Tuple[Tuple[str, str], ...], int], Dict[str, Any]] = {}
        for series in doc["series"]:
            key_tags = tuple(sorted(series["tags"].items()))
            for ts, value in series["points"]:
                row = rows.setdefault(
                    (key_tags, ts), {"tags": dict(key_tags), "ts": ts, "fields": {}}
                )
                row["fields"][series["field"]] = value
        return sorted(rows.values(), key=lambda r: (r["ts"], sorted(r["tags"].items())))

    def wait_points(
        self, count: int, measurement: str = "inference", timeout_s: float = 10.0, **tags: str
    ) -> List[Dict[str, Any]]:
        """Waits until at least ``count`` points are stored; fails with what is there."""
        got = wait_for(
            timeout_s,
            lambda: (lambda p: p if len(p) >= count else None)(self.points(measurement, **tags)),
            every_s=0.05,
        )
        if got is None:
            have = self.points(measurement, **tags)
            pytest.fail(f"expected {count} {measurement} points, the agent has {len(have)}: {have[:3]}")
        return got


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    a = Agent(tmp_path).start()
    try:
        yield a
    finally:
        a.kill()


@pytest.fixture
def token_agent(tmp_path: Path) -> Iterator[Agent]:
    a = Agent(tmp_path, token="s3cret-token").start()
    try:
        yield a
    finally:
        a.kill()
