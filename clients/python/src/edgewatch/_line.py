"""InfluxDB line protocol encoding: one point in, one line out.

Pure functions of their arguments: no IO, no clock, no state. The sender thread calls them;
the application's hot path never does. A value line protocol cannot carry (NaN, infinity,
None) is left out of the line; a point with no field left encodes to ``None``.
"""

from __future__ import annotations

import math
from typing import Dict, Iterable, Mapping, Optional, Tuple, Union

FieldValue = Union[float, int, bool, str]

_PRECISION_DIVISOR = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}

_KEY_ESCAPES = str.maketrans({",": "\\,", "=": "\\=", " ": "\\ ", "\n": " ", "\r": " "})
_KEY_CACHE: Dict[str, str] = {}
_KEY_CACHE_MAX = 4096
_MEASUREMENTS: Dict[str, str] = {}
_MEASUREMENT_ESCAPES = str.maketrans({",": "\\,", " ": "\\ ", "\n": " ", "\r": " "})


def precision_divisor(precision: str) -> int:
    """Nanoseconds per unit of ``precision`` (``ns``, ``us``, ``ms`` or ``s``)."""
    try:
        return _PRECISION_DIVISOR[precision]
    except KeyError:
        raise ValueError(
            f"precision {precision!r} is not one of {', '.join(_PRECISION_DIVISOR)}"
        ) from None


def escape_key(text: str) -> str:
    """A tag key, tag value or field key with ``,``, ``=`` and space escaped."""
    return text.translate(_KEY_ESCAPES)


def escape_measurement(text: str) -> str:
    """A measurement name with ``,`` and space escaped."""
    return text.translate(_MEASUREMENT_ESCAPES)


def encode_tags(tags: Iterable[Tuple[str, str]]) -> str:
    """``,k=v,k2=v2`` for the tags with a non-empty key and value, sorted by key."""
    parts = [
        f",{escape_key(k)}={escape_key(v)}" for k, v in sorted(tags) if k and v
    ]
    return "".join(parts)


def encode_field_value(value: object) -> Optional[str]:
    """A field value as line protocol writes it; ``None`` for one it cannot carry."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value}i"
    if isinstance(value, float):
        if math.isfinite(value):
            return repr(value)
        return None
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'
    return None


def _key(key: str) -> str:
    """``escape_key``, remembered: field keys repeat from point to point."""
    escaped = _KEY_CACHE.get(key)
    if escaped is None:
        escaped = key.translate(_KEY_ESCAPES)
        if len(_KEY_CACHE) < _KEY_CACHE_MAX:
            _KEY_CACHE[key] = escaped
    return escaped


def encode_fields(fields: Mapping[str, object]) -> str:
    """``k=v,k2=v2`` for every field that has a value line protocol can carry."""
    parts = []
    for key, value in fields.items():
        if not key:
            continue
        kind = type(value)
        if kind is float:
            if math.isfinite(value):  # type: ignore[arg-type]
                parts.append(f"{_key(key)}={value!r}")
        elif kind is bool:
            parts.append(f"{_key(key)}={'true' if value else 'false'}")
        elif kind is int:
            parts.append(f"{_key(key)}={value}i")
        else:
            encoded = encode_field_value(value)
            if encoded is not None:
                parts.append(f"{_key(key)}={encoded}")
    return ",".join(parts)


def encode_line(
    measurement: str,
    tag_text: str,
    fields: Mapping[str, object],
    ts_ns: Optional[int],
    divisor: int = 1,
) -> Optional[str]:
    """One line: ``measurement`` (unescaped), ``tag_text`` (from :func:`encode_tags`),
    ``fields`` and a timestamp in ns, written in units of ``divisor`` ns. ``None`` when no
    field can be written."""
    field_text = encode_fields(fields)
    if not field_text:
        return None
    head = _MEASUREMENTS.get(measurement)
    if head is None:
        head = escape_measurement(measurement)
        if len(_MEASUREMENTS) < _KEY_CACHE_MAX:
            _MEASUREMENTS[measurement] = head
    head += tag_text
    if ts_ns is None:
        return f"{head} {field_text}"
    return f"{head} {field_text} {ts_ns // divisor}"


def pack(lines: Iterable[str], max_bytes: int) -> Iterable[Tuple[bytes, int]]:
    """Groups lines into bodies of at most ``max_bytes`` bytes (newline-joined), yielding
    ``(body, line_count)``. A single line longer than ``max_bytes`` is yielded alone with a
    count of ``-1`` so that the caller can drop and count it."""
    body: list[bytes] = []
    size = 0
    for line in lines:
        data = line.encode("utf-8")
        if len(data) > max_bytes:
            yield data, -1
            continue
        extra = len(data) + (1 if body else 0)
        if body and size + extra > max_bytes:
            yield b"\n".join(body), len(body)
            body, size = [], 0
            extra = len(data)
        body.append(data)
        size += extra
    if body:
        yield b"\n".join(body), len(body)
