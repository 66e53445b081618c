"""Write a bundle directory so that it exists only complete: build it hidden, rename it into place."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dflash_trt.errors import DFlashError


def check_output_dir(out: Path) -> None:
    """Create `out`'s parent and make sure a directory can be written there, or say in one line why
    not: checked before any weights load, so a bad -o costs seconds, not an export."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError as err:  # a file where a directory must be
        raise DFlashError(f"cannot write {out}: {err.filename} is a file, not a directory") from None
    except OSError as err:
        raise DFlashError(f"cannot write {out}: {err.strerror} ({err.filename})") from None
    if not out.parent.is_dir():
        raise DFlashError(f"cannot write {out}: {out.parent} is not a directory")
    if not os.access(out.parent, os.W_OK | os.X_OK):
        raise DFlashError(f"cannot write {out}: {out.parent} is not writable")
    if out.exists() and not out.is_dir():
        raise DFlashError(f"cannot write {out}: a file is in the way")


@contextmanager
def staged_directory(out: Path) -> Iterator[Path]:
    """Yields a hidden sibling of `out` to fill; when the block ends without an error, the sibling
    replaces `out` (an existing one is removed only then). On any error nothing is left behind."""
    check_output_dir(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        yield tmp
        if out.exists():
            shutil.rmtree(out)
        tmp.replace(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
