"""Hugging Face transformers integration: :class:`Streamer`, passed as
``model.generate(..., streamer=...)``, makes each ``generate`` call one ``llm`` point (see
:meth:`edgewatch.Recorder.generate`) with exact token counts.

It follows transformers' streamer protocol (``put`` / ``end``): the first ``put`` of a
call carries the prompt ids (``prompt_tokens``: their last dimension) and starts the
timing, each later ``put`` is one decoding step (one token per sequence; a step of an
assisted generation that accepted ``k`` tokens, shape ``[1, k]``, is ``k`` tokens and one
gap), ``end()`` writes the point. For the exception path, time the call inside
``with rec.generate(...) as g:`` and pass ``Streamer(g)``: an exception in ``generate``
is then ``ok=false`` and propagates unchanged. ``then=`` hands every ``put``/``end`` on
to another streamer (a ``TextIteratorStreamer``).

transformers and torch are never imported here: the streamer only reads the ``shape`` of
what ``put`` receives. Meant for batch size 1 (for a batch, a step counts as one token
and padding after a sequence finished is counted too).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from ._llm import Generation
from ._recorder import Recorder

__all__ = ["Streamer"]


def _shape(value: Any) -> tuple:
    shape = getattr(value, "shape", None)
    if shape is None:
        try:
            return (len(value),)
        except TypeError:
            return ()
    return tuple(int(d) for d in shape)


class Streamer:
    """A ``generate`` streamer that times the call: ``Streamer(rec, model="name")``
    (a new ``llm`` point per ``generate`` call, reusable) or ``Streamer(g)`` for a
    ``Generation`` you entered (the point is written when your ``with`` block ends)."""

    def __init__(
        self,
        rec: Any,
        model: Optional[str] = None,
        *,
        server: Optional[str] = "transformers",
        model_version: Optional[str] = None,
        tags: Optional[Mapping[str, str]] = None,
        then: Any = None,
    ) -> None:
        if isinstance(rec, Generation):
            self._gen: Optional[Generation] = rec
            self._rec: Optional[Recorder] = None
        elif isinstance(rec, Recorder):
            if model is None:
                raise TypeError("Streamer(rec, model=...) needs the model's name")
            self._gen = None
            self._rec = rec
        else:
            raise TypeError("Streamer needs an edgewatch Recorder or a Generation")
        self._model = model
        self._server = server
        self._version = model_version
        self._tags = dict(tags) if tags else None
        self._then = then
        self._owned = False
        self._prompt_seen = False

    def put(self, value: Any) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            gen = self._gen
            if gen is None:
                assert self._rec is not None and self._model is not None
                gen = self._gen = self._rec.generate(
                    self._model, server=self._server, model_version=self._version, tags=self._tags
                )
                self._owned = True
                gen.__enter__()
            shape = _shape(value)
            if shape:
                gen.fields["prompt_tokens"] = shape[-1]
        else:
            gen = self._gen
            assert gen is not None
            shape = _shape(value)
            gen.token(shape[-1] if len(shape) >= 2 else 1)
        if self._then is not None:
            self._then.put(value)

    def end(self) -> None:
        gen = self._gen
        if gen is not None:
            gen.done()
            if self._owned:
                gen.__exit__(None, None, None)
                self._gen = None
                self._owned = False
        self._prompt_seen = False
        if self._then is not None:
            self._then.end()
