"""OpenAI client integration: ``instrument(client, rec)`` times every
``client.chat.completions.create(...)`` and ``client.completions.create(...)`` of an
``openai.OpenAI`` or ``openai.AsyncOpenAI`` client from the caller's side, as ``llm``
points (see :meth:`edgewatch.Recorder.generate`), with no other change to the application.

Streamed calls: the time to the first chunk carrying content (text, refusal, reasoning or
a tool call) is ``ttft_ms``, each later content chunk is one inter-token gap
(``itl_ms``), and the token counts come from the server's ``usage``: when the caller did
not set ``stream_options``, ``{"include_usage": True}`` is added and the extra usage-only
chunk it brings is kept from the caller (who did not ask for it). Without usage the
content chunks are counted (``tokens_counted=true``). A stream that raises, that the
caller closes or drops before its end, or that ends without a ``finish_reason`` (a cut
connection) is ``ok=false``. Non-streamed calls: ``e2e_ms`` and the usage counts, no
``ttft_ms`` (the caller sees every token at once).

openai is never imported here: the wrappers are set on the client object passed in. What
``create`` returns and raises is unchanged; the telemetry itself never raises into the
application (a failure to read a chunk or a response is logged on ``edgewatch`` and the
point keeps what it has).
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple

from ._llm import Generation
from ._recorder import Recorder

__all__ = ["instrument", "uninstrument", "server_name"]

log = logging.getLogger("edgewatch")
_perf_ns = time.perf_counter_ns
_MARK = "_edgewatch_original"
_RESOURCES = (("chat", "completions"), ("completions",))


def server_name(client: Any) -> str:
    """``host:port`` of the client's ``base_url`` (the port its scheme implies when the
    URL has none)."""
    url = getattr(client, "base_url", None)
    host = getattr(url, "host", None)
    if not host:
        return "unknown"
    port = getattr(url, "port", None)
    if port is None:
        port = 443 if str(getattr(url, "scheme", "")) == "https" else 80
    return f"{host}:{port}"


def _given(value: Any) -> bool:
    """Whether a keyword argument was given (openai marks "not given" with sentinels)."""
    return value is not None and type(value).__name__ not in ("NotGiven", "Omit")


def _resource(client: Any, path: Tuple[str, ...]) -> Any:
    obj = client
    for name in path:
        obj = getattr(obj, name)
    return obj


def instrument(
    client: Any,
    rec: Optional[Recorder] = None,
    *,
    server: Optional[str] = None,
    app: Optional[str] = None,
    model_version: Optional[str] = None,
    tags: Optional[Mapping[str, str]] = None,
) -> Any:
    """Wraps ``create`` of ``client.chat.completions`` and ``client.completions`` (sync
    or async client) so that each call is one ``llm`` point of the request's ``model``;
    returns ``client``. ``rec`` defaults to a :class:`Recorder` on
    ``udp://127.0.0.1:8089`` (with ``app``); ``server`` defaults to the client's
    ``base_url`` ``host:port``; ``app`` (when given with a ``rec``) and ``tags`` are added
    to the points. Instrumenting twice replaces the earlier wrappers."""
    if rec is None:
        rec = Recorder(app=app)
        app = None
    extra: Dict[str, str] = {str(k): str(v) for k, v in (tags or {}).items()}
    if app is not None:
        extra["app"] = str(app)
    where = server if server is not None else server_name(client)
    opts = _Options(rec, where, model_version, extra or None)
    for path in _RESOURCES:
        try:
            res = _resource(client, path)
        except AttributeError:
            continue
        create = getattr(res, "create", None)
        if create is None:
            continue
        create = getattr(create, _MARK, create)
        if inspect.iscoroutinefunction(create) or type(res).__name__.startswith("Async"):
            wrapper: Any = _async_wrapper(create, opts)
        else:
            wrapper = _sync_wrapper(create, opts)
        setattr(wrapper, _MARK, create)
        res.create = wrapper
    return client


def uninstrument(client: Any) -> Any:
    """Puts the original ``create`` methods back; returns ``client``."""
    for path in _RESOURCES:
        try:
            res = _resource(client, path)
        except AttributeError:
            continue
        if _MARK in getattr(res.create, "__dict__", {}):
            del res.create  # the instance attribute: the class's method shows again
    return client


class _Options:
    __slots__ = ("rec", "server", "model_version", "tags")

    def __init__(
        self, rec: Recorder, server: str, model_version: Optional[str], tags: Optional[Dict[str, str]]
    ) -> None:
        self.rec = rec
        self.server = server
        self.model_version = model_version
        self.tags = tags


def _start(opts: _Options, kwargs: Dict[str, Any]) -> Tuple[Generation, bool, bool]:
    """The request's ``Generation`` (entered), whether it streams, and whether
    ``include_usage`` was added to its ``stream_options`` here."""
    stream = bool(kwargs.get("stream")) if _given(kwargs.get("stream")) else False
    added = False
    if stream and not _given(kwargs.get("stream_options")):
        kwargs["stream_options"] = {"include_usage": True}
        added = True
    model = kwargs.get("model")
    gen = opts.rec.generate(
        str(model) if _given(model) else "unknown",
        server=opts.server,
        model_version=opts.model_version,
        tags=opts.tags,
    )
    gen.__enter__()
    return gen, stream, added


def _finish(gen: Generation, error: Optional[BaseException] = None) -> None:
    try:
        if error is None:
            gen.__exit__(None, None, None)
        else:
            gen.__exit__(type(error), error, error.__traceback__)
    except Exception as e:  # telemetry never raises into the application
        log.warning("edgewatch: recording an LLM request failed: %r", e)


def _apply_usage(gen: Generation, usage: Any) -> bool:
    """Sets ``prompt_tokens`` and the reported output count from ``usage``."""
    if usage is None:
        return False
    completion = getattr(usage, "completion_tokens", None)
    prompt = getattr(usage, "prompt_tokens", None)
    if isinstance(prompt, int):
        gen.fields["prompt_tokens"] = prompt
    if isinstance(completion, int):
        gen._reported = completion
        return True
    return False


def _record_response(gen: Generation, result: Any) -> None:
    """A non-streamed result: usage counts, no first-token time."""
    try:
        gen.done()
        # No usage (or not a completion: ``with_raw_response``): the count is unknown.
        if not _apply_usage(gen, getattr(result, "usage", None)):
            gen._reported = -1
    except Exception as e:
        log.warning("edgewatch: reading an OpenAI response failed: %r", e)
    _finish(gen)


def _has_content(chunk: Any) -> Tuple[bool, bool]:
    """(carries content, carries a finish_reason)"""
    content = finished = False
    for choice in getattr(chunk, "choices", None) or ():
        if getattr(choice, "finish_reason", None):
            finished = True
        delta = getattr(choice, "delta", None)
        if delta is None:  # completions: the text is on the choice
            if getattr(choice, "text", None):
                content = True
            continue
        if (
            getattr(delta, "content", None)
            or getattr(delta, "tool_calls", None)
            or getattr(delta, "refusal", None)
            or getattr(delta, "reasoning_content", None)
            or getattr(delta, "reasoning", None)
        ):
            content = True
    return content, finished


class _Tracker:
    """What the wrappers of one stream share: the generation and how the stream ended."""

    __slots__ = ("gen", "added", "finished", "ended", "last")

    def __init__(self, gen: Generation, added: bool) -> None:
        self.gen = gen
        self.added = added
        self.finished = False
        self.ended = False
        self.last = 0

    def see(self, chunk: Any) -> bool:
        """Notes one chunk; ``False`` when it is the usage-only chunk the caller did not
        ask for (then it is not handed on)."""
        gen = self.gen
        gen.token()  # the arrival time first: reading the chunk comes after
        try:
            content, finished = _has_content(chunk)
            if not content:
                gen._times.pop()
            if finished:
                self.finished = True
            usage = getattr(chunk, "usage", None)
            if usage is not None:
                _apply_usage(gen, usage)
                if self.added and not getattr(chunk, "choices", None):
                    return False
        except Exception as e:
            log.warning("edgewatch: reading an OpenAI chunk failed: %r", e)
        self.last = _perf_ns()
        return True

    def end(self, error: Optional[BaseException] = None, *, abandoned: bool = False, at: int = 0) -> None:
        if self.ended:
            return
        self.ended = True
        gen = self.gen
        if at:
            gen._end = at
            gen._n_at_end = len(gen._times)
        else:
            gen.done()
        if abandoned or not self.finished:
            gen._failed = True
        _finish(gen, error)


class _Stream:
    """The caller's view of an ``openai.Stream``: the same chunks (less an unasked-for
    usage chunk), timed; every other attribute is the stream's own."""

    def __init__(self, inner: Any, tracker: _Tracker) -> None:
        self._inner = inner
        self._tracker = tracker
        self._it: Optional[Iterator[Any]] = None

    def __iter__(self) -> "_Stream":
        return self

    def __next__(self) -> Any:
        it = self._it
        if it is None:
            it = self._it = iter(self._inner)
        tracker = self._tracker
        while True:
            try:
                chunk = next(it)
            except StopIteration:
                tracker.end()
                raise
            except BaseException as e:
                tracker.end(e)
                raise
            if tracker.see(chunk):
                return chunk

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self._tracker.end(abandoned=True)

    def __enter__(self) -> "_Stream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        tracker = getattr(self, "_tracker", None)
        if tracker is not None and not tracker.ended:
            # Dropped before its end (a `break` out of the loop): ended at the last chunk.
            tracker.end(abandoned=True, at=tracker.last or _perf_ns())

    def __getattr__(self, name: str) -> Any:
        if name in ("_inner", "_tracker", "_it"):
            raise AttributeError(name)
        return getattr(self._inner, name)


class _AsyncStream:
    """The caller's view of an ``openai.AsyncStream`` (as :class:`_Stream`)."""

    def __init__(self, inner: Any, tracker: _Tracker) -> None:
        self._inner = inner
        self._tracker = tracker
        self._it: Any = None

    def __aiter__(self) -> "_AsyncStream":
        return self

    async def __anext__(self) -> Any:
        it = self._it
        if it is None:
            it = self._it = self._inner.__aiter__()
        tracker = self._tracker
        while True:
            try:
                chunk = await it.__anext__()
            except StopAsyncIteration:
                tracker.end()
                raise
            except BaseException as e:
                tracker.end(e)
                raise
            if tracker.see(chunk):
                return chunk

    async def close(self) -> None:
        try:
            await self._inner.close()
        finally:
            self._tracker.end(abandoned=True)

    async def __aenter__(self) -> "_AsyncStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def __del__(self) -> None:
        tracker = getattr(self, "_tracker", None)
        if tracker is not None and not tracker.ended:
            tracker.end(abandoned=True, at=tracker.last or _perf_ns())

    def __getattr__(self, name: str) -> Any:
        if name in ("_inner", "_tracker", "_it"):
            raise AttributeError(name)
        return getattr(self._inner, name)


def _is_stream(result: Any, names: Tuple[str, ...]) -> bool:
    return type(result).__name__ in names


def _sync_wrapper(create: Any, opts: _Options) -> Any:
    @functools.wraps(create)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            gen, stream, added = _start(opts, kwargs)
        except Exception as e:
            log.warning("edgewatch: timing an OpenAI call failed: %r", e)
            return create(*args, **kwargs)
        try:
            result = create(*args, **kwargs)
        except BaseException as e:
            _finish(gen, e)
            raise
        if inspect.isawaitable(result):  # an async client not recognised as one
            return _finish_async(result, gen, stream, added)
        if not stream:
            _record_response(gen, result)
            return result
        if not _is_stream(result, ("Stream",)):
            return result  # a raw response: not timed (nothing recorded)
        return _Stream(result, _Tracker(gen, added))

    return wrapper


def _async_wrapper(create: Any, opts: _Options) -> Any:
    @functools.wraps(create)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            gen, stream, added = _start(opts, kwargs)
        except Exception as e:
            log.warning("edgewatch: timing an OpenAI call failed: %r", e)
            return await create(*args, **kwargs)
        try:
            pending = create(*args, **kwargs)
        except BaseException as e:
            _finish(gen, e)
            raise
        return await _finish_async(pending, gen, stream, added)

    return wrapper


async def _finish_async(pending: Any, gen: Generation, stream: bool, added: bool) -> Any:
    try:
        result = await pending
    except BaseException as e:
        _finish(gen, e)
        raise
    if not stream:
        _record_response(gen, result)
        return result
    if not _is_stream(result, ("AsyncStream",)):
        return result
    return _AsyncStream(result, _Tracker(gen, added))

