"""What of a cumulative output may be streamed yet: text that later steps can still change is held back."""

from __future__ import annotations


def settled_text(text: str, stops: tuple[str, ...], final: bool) -> str:
    """The prefix of `text` no later step can rewrite.

    Two things can still change at the end of a running request's text: a trailing U+FFFD (the
    first bytes of a multi-byte character whose rest has not been generated) and a suffix that
    begins a stop string (cut from the text if the stop string completes). Both are held back
    until the request finishes, so the streamed deltas always add up to the final text.
    """
    if final:
        return text
    end = len(text.rstrip("\ufffd"))
    held = max((n for stop in stops for n in range(1, min(len(stop), end + 1))
                if text[end - n:end] == stop[:n]), default=0)
    return text[:end - held]


class DeltaStream:
    """Turns cumulative (text, token ids) into the pieces not sent yet."""

    def __init__(self, stops: tuple[str, ...] = ()):
        self.stops = stops
        self.text = ""  # sent so far
        self.tokens = 0

    def next(self, text: str, token_ids: list[int], final: bool) -> tuple[str, list[int]]:
        settled = settled_text(text, self.stops, final)
        # `settled` extends what was sent except if the text was rewritten behind the held-back part
        # (a tokenizer whose decode is not prefix-stable); then nothing more goes out until it is.
        delta = settled[len(self.text):] if settled.startswith(self.text) else ""
        self.text += delta
        ids = token_ids[self.tokens:]
        self.tokens = len(token_ids)
        return delta, ids
