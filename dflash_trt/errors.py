"""User-facing errors: one clear line each, raised before any work starts."""


class DFlashError(ValueError):
    """A mistake the user can fix (bad path, mismatched pair, bad parameter).

    The CLI prints `str(err)` as a single line and exits with status 2; the Python API lets it
    propagate. Internal invariants use `assert`, never this class.
    """


class Busy(DFlashError):
    """A request refused for now, not for what it asks: the waiting queue is full, or the engine is
    draining. A server answers 429 (retry later) or 503 (gone soon) for it."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status
