"""User-facing errors: one clear line each, raised before any work starts."""


class DFlashError(ValueError):
    """A mistake the user can fix (bad path, mismatched pair, bad parameter).

    The CLI prints `str(err)` as a single line and exits with status 2; the Python API lets it
    propagate. Internal invariants use `assert`, never this class.
    """
