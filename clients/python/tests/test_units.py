"""Pure parts, without a socket or a clock: line-protocol encoding and packing, the HTTP
retry decisions and the backoff."""

from __future__ import annotations

import calendar
import email.utils

import pytest

from edgewatch import _line, _retry
from edgewatch._transport import parse_url


def test_line_escaping_types_and_precision() -> None:
    tags = _line.encode_tags([("model", "yolo v8,n=1"), ("app", "cam"), ("empty", "")])
    assert tags == ",app=cam,model=yolo\\ v8\\,n\\=1"
    line = _line.encode_line(
        "infer ence",
        tags,
        {"wall_ms": 18.2, "batch_size": 4, "ok": False, "note": 'a "b"\\', "nan": float("nan"), "none": None},
        1_764_000_000_123_456_789,
        _line.precision_divisor("ms"),
    )
    assert line == (
        'infer\\ ence,app=cam,model=yolo\\ v8\\,n\\=1 wall_ms=18.2,batch_size=4i,ok=false,'
        'note="a \\"b\\"\\\\" 1764000000123'
    )
    assert _line.encode_line("m", "", {"x": float("inf")}, 1) is None
    assert _line.encode_field_value(1e-05) == "1e-05"
    with pytest.raises(ValueError, match="precision"):
        _line.precision_divisor("ps")


def test_pack_keeps_bodies_under_the_limit_and_flags_oversized_lines() -> None:
    lines = ["a" * 40, "b" * 40, "c" * 40, "d" * 200, "e" * 10]
    packed = list(_line.pack(lines, 100))
    assert [(len(body), n) for body, n in packed] == [(81, 2), (200, -1), (51, 2)]
    assert all(len(body) <= 100 for body, n in packed if n > 0)
    assert packed[0][0] == b"a" * 40 + b"\n" + b"b" * 40


@pytest.mark.parametrize(
    "status,action",
    [(204, "sent"), (200, "sent"), (None, "retry"), (503, "retry"), (429, "retry"), (500, "retry"),
     (401, "drop"), (403, "drop"), (404, "drop"), (413, "split")],
)
def test_decisions(status, action) -> None:
    assert _retry.decide(status, None, b"", 10, 0.0).action == action


def test_decisions_for_partial_writes_and_single_points() -> None:
    body = b'{"error":"x","line_errors":[{"line":2,"error":"bad"}]}'
    d = _retry.decide(400, None, body, 5, 0.0)
    assert (d.action, d.rejected) == ("partial", 1)
    assert _retry.decide(400, None, b"not json", 5, 0.0).action == "drop"
    assert _retry.decide(413, None, b"", 1, 0.0).action == "drop"


def test_retry_after_seconds_and_dates() -> None:
    assert _retry.decide(503, "3", b"", 1, 0.0).delay_s == 3.0
    now = 1_800_000_000.0
    date = email.utils.formatdate(now + 12, usegmt=True)
    assert _retry.parse_retry_after(date, now) == pytest.approx(12.0)
    assert _retry.parse_retry_after("garbage", now) is None
    assert _retry.decide(503, None, b"", 1, 0.0).delay_s is None


@pytest.mark.parametrize(
    "value",
    [
        "\u0663",  # ARABIC-INDIC DIGIT THREE: int() and float() read it as 3
        "\uff13",  # FULLWIDTH DIGIT THREE
        "\u00b2",  # SUPERSCRIPT TWO: str.isdigit() is true, float() raises
        "\u00b9\u00b2",
        "-1",
        "+3",
        "1.5",
        "1e3",
        "0x10",
        "3 s",
        "",
        "Sun, 06 Nov 1994 08:49:37 EST",  # an HTTP-date is in GMT only
        "06 Nov 1994 08:49:37 GMT",  # no day name: not one of RFC 9110's three forms
        "Sun, 6 Nov 1994 08:49:37 GMT",  # IMF-fixdate has a two-digit day
        "Sun, 31 Feb 2030 00:00:00 GMT",  # no such day
        "Sun, 06 Nov 1994 25:00:00 GMT",
        "Sun, \u0660\u0666 Nov 1994 08:49:37 GMT",
    ],
)
def test_retry_after_other_than_ascii_seconds_or_an_http_date_means_backoff(value: str) -> None:
    now = 1_800_000_000.0
    assert _retry.parse_retry_after(value, now) is None
    d = _retry.decide(503, value, b"", 3, now)
    assert (d.action, d.delay_s) == ("retry", None)


def test_retry_after_reads_the_three_http_date_forms() -> None:
    now = float(calendar.timegm((2027, 1, 15, 8, 0, 0)))
    for text in ("Fri, 15 Jan 2027 08:00:12 GMT", "Friday, 15-Jan-27 08:00:12 GMT", "Fri Jan 15 08:00:12 2027"):
        assert _retry.parse_retry_after(text, now) == pytest.approx(12.0), text
    assert _retry.parse_retry_after("Fri Jan  1 00:00:00 2027", now) == 0.0  # in the past
    # RFC 850's two-digit year: not more than 50 years ahead, else the century before.
    assert _retry.parse_http_date("Sunday, 06-Nov-94 08:49:37 GMT", now) == calendar.timegm((1994, 11, 6, 8, 49, 37))
    assert _retry.parse_http_date("Monday, 06-Nov-75 08:49:37 GMT", now) == calendar.timegm((2075, 11, 6, 8, 49, 37))
    assert _retry.parse_retry_after(" 7\t", now) == 7.0


def test_retry_after_is_capped_at_the_documented_maximum() -> None:
    now = 1_800_000_000.0
    assert _retry.RETRY_AFTER_MAX_S == 3600.0
    assert _retry.parse_retry_after("86400", now) == 3600.0
    assert _retry.parse_retry_after("9" * 5000, now) == 3600.0  # int() refuses 5000 digits
    a_year_on = email.utils.formatdate(now + 365 * 86400, usegmt=True)
    assert _retry.parse_retry_after(a_year_on, now) == 3600.0
    assert _retry.decide(429, "3599", b"", 1, now).delay_s == 3599.0


def test_a_400_body_nested_too_deep_for_json_is_a_drop_not_an_exception() -> None:
    assert _retry.decide(400, None, b"[" * 100_000, 5, 0.0).action == "drop"


def test_backoff_grows_is_capped_and_jittered() -> None:
    assert _retry.backoff_delay(1, 0.1, 5.0, 0.0) == pytest.approx(0.05)
    assert _retry.backoff_delay(1, 0.1, 5.0, 1.0) == pytest.approx(0.1)
    assert _retry.backoff_delay(4, 0.1, 5.0, 1.0) == pytest.approx(0.8)
    assert _retry.backoff_delay(30, 0.1, 5.0, 0.5) == pytest.approx(3.75)


def test_urls() -> None:
    assert parse_url("udp://127.0.0.1:8089").port == 8089
    assert parse_url("http://[::1]:9400/prefix/").path == "/prefix"
    assert parse_url("http://host").port == 9400
    with pytest.raises(ValueError, match="expected udp://"):
        parse_url("tcp://host:1")
