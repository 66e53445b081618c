"""Streamed deltas add up to the final text, whatever the last step rewrote."""

from dflash_trt.serve.deltas import DeltaStream, settled_text


def test_trailing_partial_character_is_held_back():
    assert settled_text("ab\ufffd", (), final=False) == "ab"
    assert settled_text("ab\ufffd", (), final=True) == "ab\ufffd"


def test_a_possible_stop_string_is_held_back():
    assert settled_text("hello EN", ("END",), final=False) == "hello "
    assert settled_text("hello E", ("END", "Ex"), final=False) == "hello "
    assert settled_text("hello X", ("END",), final=False) == "hello X"


def test_deltas_add_up_when_the_stop_string_is_cut():
    # cumulative texts as the engine reports them; the stop string "END" is cut from the last one
    steps = [("he", False), ("hello E", False), ("hello EN", False), ("hello ", True)]
    stream = DeltaStream(("END",))
    pieces = [stream.next(text, list(range(i + 1)), final)[0] for i, (text, final) in enumerate(steps)]
    assert "".join(pieces) == "hello "


def test_deltas_add_up_when_a_character_completes():
    steps = [("a\ufffd", False), ("aé", False), ("aéb", True)]
    stream = DeltaStream()
    pieces = [stream.next(text, [0] * (i + 1), final) for i, (text, final) in enumerate(steps)]
    assert "".join(p[0] for p in pieces) == "aéb"
    assert sum(len(p[1]) for p in pieces) == 3
