"""The two ways a batch of lines reaches the agent: UDP datagrams and HTTP writes.

Only the sender thread calls these; each call does blocking IO bounded by a timeout and
never raises: a failure comes back as a value (a datagram count, or an HTTP status of
``None``). Whether and when to retry is decided in ``_retry``, not here.
"""

from __future__ import annotations

import http.client
import socket
import ssl
from dataclasses import dataclass
from typing import Any, Optional, Tuple
from urllib.parse import urlencode, urlsplit


@dataclass(frozen=True)
class Endpoint:
    """A parsed agent address: ``udp://host:port``, ``http://host:port[/prefix]`` or
    ``https://...``."""

    scheme: str
    host: str
    port: int
    path: str


def parse_url(url: str) -> Endpoint:
    """Reads an agent address; raises ``ValueError`` naming what is wrong with it."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("udp", "http", "https"):
        raise ValueError(
            f"agent address {url!r}: expected udp://HOST:PORT, http://HOST:PORT or https://HOST:PORT"
        )
    if not parts.hostname:
        raise ValueError(f"agent address {url!r} has no host")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"agent address {url!r} has an invalid port") from None
    if port is None:
        port = {"udp": 8089, "http": 9400, "https": 443}[scheme]
    return Endpoint(scheme, parts.hostname, port, parts.path.rstrip("/"))


class UdpTransport:
    """Sends bodies as UDP datagrams from one unconnected socket."""

    def __init__(self, endpoint: Endpoint, timeout_s: float) -> None:
        self._endpoint = endpoint
        self._timeout = timeout_s
        self._sock: Optional[socket.socket] = None
        self._addr: Tuple[Any, ...] = ()
        self.last_error = ""

    def _socket(self) -> Optional[socket.socket]:
        if self._sock is not None:
            return self._sock
        try:
            infos = socket.getaddrinfo(
                self._endpoint.host, self._endpoint.port, type=socket.SOCK_DGRAM
            )
            family, kind, proto, _, addr = infos[0]
            sock = socket.socket(family, kind, proto)
            sock.settimeout(self._timeout)
        except OSError as e:
            self.last_error = f"udp socket to {self._endpoint.host}:{self._endpoint.port}: {e}"
            return None
        self._sock, self._addr = sock, addr
        return sock

    def send(self, body: bytes) -> bool:
        """Sends one datagram; ``False`` (with ``last_error``) when the kernel refused it."""
        sock = self._socket()
        if sock is None:
            return False
        try:
            sock.sendto(body, self._addr)
            return True
        except OSError as e:
            self.last_error = f"udp send to {self._endpoint.host}:{self._endpoint.port}: {e}"
            return False

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def forget(self) -> None:
        """After ``fork``, in the child: the socket is the parent's; open a new one."""
        self.close()


@dataclass(frozen=True)
class Answer:
    """One HTTP attempt: ``status`` is ``None`` when no answer came (``error`` says why)."""

    status: Optional[int]
    retry_after: Optional[str] = None
    body: bytes = b""
    error: str = ""


class HttpTransport:
    """POSTs bodies to the agent's InfluxDB-compatible ``/write`` on one keep-alive
    connection, reopened after any failure."""

    def __init__(
        self,
        endpoint: Endpoint,
        token: Optional[str],
        timeout_s: float,
        precision: str,
    ) -> None:
        self._endpoint = endpoint
        self._timeout = timeout_s
        self._path = f"{endpoint.path}/write?{urlencode({'precision': precision})}"
        self._headers = {"Content-Type": "text/plain; charset=utf-8"}
        if token:
            self._headers["Authorization"] = f"Token {token}"
        self._conn: Optional[http.client.HTTPConnection] = None

    def _connect(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self._endpoint.scheme == "https":
                self._conn = http.client.HTTPSConnection(
                    self._endpoint.host,
                    self._endpoint.port,
                    timeout=self._timeout,
                    context=ssl.create_default_context(),
                )
            else:
                self._conn = http.client.HTTPConnection(
                    self._endpoint.host, self._endpoint.port, timeout=self._timeout
                )
        return self._conn

    def _attempt(self, body: bytes) -> Answer:
        conn = self._connect()
        conn.request("POST", self._path, body=body, headers=self._headers)
        resp = conn.getresponse()
        data = resp.read()
        answer = Answer(resp.status, resp.getheader("Retry-After"), data)
        if resp.getheader("Connection", "").lower() == "close":
            self.close()
        return answer

    def send(self, body: bytes) -> Answer:
        """One write. A keep-alive connection the agent closed meanwhile (a restart) is
        retried once at once on a fresh connection; any other failure is an answer with
        ``status=None``."""
        reused = self._conn is not None
        try:
            return self._attempt(body)
        except (OSError, http.client.HTTPException) as e:
            self.close()
            if not reused:
                return Answer(None, error=f"POST {self._describe()}: {e}")
        try:
            return self._attempt(body)
        except (OSError, http.client.HTTPException) as e:
            self.close()
            return Answer(None, error=f"POST {self._describe()}: {e}")

    def forget(self) -> None:
        """After ``fork``, in the child: the connection is the parent's. Drop it without
        a word on it (closing our copy of the descriptor leaves the parent's open)."""
        if self._conn is not None and self._conn.sock is not None:
            self._conn.sock.close()
        self._conn = None

    def _describe(self) -> str:
        ep = self._endpoint
        return f"{ep.scheme}://{ep.host}:{ep.port}{self._path}"

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except OSError:
                pass
            self._conn = None
