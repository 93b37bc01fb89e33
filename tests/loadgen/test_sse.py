"""The SSE parser: every framing variation, and any split of a stream into reads."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadgen.sse import DONE, ServerSentEvent, SSEParser


def parse(*chunks: bytes) -> list[ServerSentEvent]:
    parser = SSEParser()
    events: list[ServerSentEvent] = []
    for chunk in chunks:
        events.extend(parser.feed(chunk))
    events.extend(parser.close())
    return events


def datas(*chunks: bytes) -> list[str]:
    return [e.data for e in parse(*chunks)]


def test_lf_framing() -> None:
    assert datas(b'data: {"a": 1}\n\ndata: [DONE]\n\n') == ['{"a": 1}', DONE]


def test_crlf_framing() -> None:
    assert datas(b"data: x\r\n\r\ndata: y\r\n\r\n") == ["x", "y"]


def test_lone_cr_framing() -> None:
    assert datas(b"data: x\r\rdata: y\r\r") == ["x", "y"]


def test_crlf_split_between_cr_and_lf_is_one_line_break() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: x\r") == []
    assert parser.feed(b"\n\r") == []
    assert [e.data for e in parser.feed(b"\n")] == ["x"]
    assert parser.close() == []


def test_event_is_returned_as_soon_as_its_blank_line_arrives() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\n") == []
    assert [e.data for e in parser.feed(b"\ndata: b\n")] == ["a"]
    assert [e.data for e in parser.feed(b"\n")] == ["b"]


def test_comments_are_ignored_between_and_inside_events() -> None:
    assert datas(b": keep-alive\n\n: x\ndata: a\n: y\n\n:\n\n") == ["a"]


def test_multi_line_data_joined_with_newlines() -> None:
    assert datas(b'data: {\ndata:  "a": 1\ndata: }\n\n') == ['{\n "a": 1\n}']


def test_only_one_leading_space_is_stripped_and_colon_optional() -> None:
    assert datas(b"data:x\n\ndata:  y\n\ndata\n\n") == ["x", " y", ""]


def test_blank_lines_without_data_dispatch_nothing() -> None:
    assert datas(b"\n\n\n\nevent: ping\n\n\r\n") == []


def test_empty_data_field_is_an_event_with_empty_data() -> None:
    assert datas(b"data:\n\n") == [""]


def test_event_id_retry_and_unknown_fields() -> None:
    (event,) = parse(b"event: update\nid: 7\nretry: 100\nfoo: bar\ndata: x\n\n")
    assert event == ServerSentEvent(data="x", event="update", id="7", retry=100)
    (second,) = parse(b"id: 1\ndata: a\n\n", b"retry: x\ndata: b\n\n")[1:]
    assert second.id == "1"  # the last event id persists, as WHATWG says
    assert second.retry is None  # a non-numeric retry is ignored


def test_byte_order_mark_is_stripped_even_when_split() -> None:
    assert datas(b"\xef", b"\xbb", b"\xbfdata: x\n\n") == ["x"]
    assert datas(b"\xef\xbb\xbfdata: x\n\n") == ["x"]


def test_utf8_character_split_across_reads() -> None:
    raw = "data: héllo ✓\n\n".encode()
    cut = raw.index("✓".encode()) + 1
    assert datas(raw[:cut], raw[cut:]) == ["héllo ✓"]


def test_close_dispatches_event_missing_only_its_blank_line() -> None:
    assert datas(b"data: a\n\ndata: [DONE]\n") == ["a", DONE]
    assert datas(b"data: [DONE]\r") == [DONE]


def test_close_drops_an_unterminated_last_line() -> None:
    assert datas(b'data: a\n\ndata: {"cut mid') == ["a"]


def test_feeding_nothing_is_harmless() -> None:
    parser = SSEParser()
    assert parser.feed(b"") == []
    assert parser.close() == []


# --- property: any split of a valid stream yields the same events ---------------------------

_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n\x00"),
    max_size=20,
)
_eol = st.sampled_from([b"\n", b"\r\n", b"\r"])


@st.composite
def streams(draw: st.DrawFn) -> tuple[bytes, list[str], list[int], str]:
    """A valid stream with random framing plus the data of the events it must produce.

    One stream uses one line ending, or mixes LF and CRLF; a lone CR must not be followed by a
    LF that belongs to the next line, so it is never mixed.
    """
    mode = draw(st.sampled_from(["lf", "crlf", "cr", "mixed"]))

    def eol() -> bytes:
        if mode == "mixed":
            return draw(st.sampled_from([b"\n", b"\r\n"]))
        return {"lf": b"\n", "crlf": b"\r\n", "cr": b"\r"}[mode]

    out = bytearray(b"\xef\xbb\xbf" if draw(st.booleans()) else b"")
    expected: list[str] = []
    ends: list[int] = []  # offset just past each event's dispatching blank line
    for _ in range(draw(st.integers(0, 6))):
        lines = [":" + draw(_text) for _ in range(draw(st.integers(0, 2)))]  # comments
        values: list[str] = []
        for _ in range(draw(st.integers(0, 3))):
            value = (" " if draw(st.booleans()) else "") + draw(_text)
            lines.append("data:" + value)
            values.append(value.removeprefix(" "))
            if draw(st.booleans()):
                lines.append(":" + draw(_text))
        if draw(st.booleans()):
            lines.insert(0, "event: " + draw(_text))
        for line in lines:
            out += line.encode() + eol()
        out += eol()  # the blank line that dispatches
        if values:
            expected.append("\n".join(values))
            ends.append(len(out))
    if draw(st.booleans()):
        out += b"data: " + DONE.encode() + eol() + eol()
        expected.append(DONE)
        ends.append(len(out))
    return bytes(out), expected, ends, mode


def _chunks(raw: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted(min(c, len(raw)) for c in cuts)
    return [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]


@given(streams(), st.lists(st.integers(0, 400), max_size=12))
def test_any_split_gives_the_same_events(
    stream: tuple[bytes, list[str], list[int], str], cuts: list[int]
) -> None:
    raw, expected, _, _ = stream
    whole = parse(raw)
    assert parse(*_chunks(raw, cuts)) == whole
    assert [e.data for e in whole] == expected


@given(streams(), st.lists(st.integers(0, 400), max_size=12))
def test_events_come_out_of_the_read_that_completes_them(
    stream: tuple[bytes, list[str], list[int], str], cuts: list[int]
) -> None:
    """Timeliness, which TTFT depends on: no event waits for a later read.

    With lone-CR framing a CR at the end of a read may be half of a CRLF, so that event may
    wait for one more byte (or close); every other framing must dispatch at once.
    """
    raw, _, ends, mode = stream
    parser = SSEParser()
    seen = 0
    fed = 0
    for chunk in _chunks(raw, cuts):
        seen += len(parser.feed(chunk))
        fed += len(chunk)
        due = sum(1 for end in ends if end <= fed)
        if mode == "cr":
            assert due - 1 <= seen <= due
        else:
            assert seen == due
    assert seen + len(parser.close()) == len(ends)


@given(st.binary(max_size=200), st.lists(st.integers(0, 200), max_size=8))
def test_arbitrary_bytes_never_crash_and_split_invariantly(raw: bytes, cuts: list[int]) -> None:
    assert parse(*_chunks(raw, cuts)) == parse(raw)


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_byte_by_byte_vllm_stream(size: int) -> None:
    raw = (
        b'data: {"choices":[{"index":0,"text":" a"}]}\n\n'
        b": ping\n\n"
        b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\n'
        b"data: [DONE]\n\n"
    )
    chunks = [raw[i : i + size] for i in range(0, len(raw), size)]
    assert len(parse(*chunks)) == 3
