"""Write a bundle directory so that it exists only complete: build it hidden, rename it into place."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def staged_directory(out: Path) -> Iterator[Path]:
    """Yields a hidden sibling of `out` to fill; when the block ends without an error, the sibling
    replaces `out` (an existing one is removed only then). On any error nothing is left behind."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        yield tmp
        if out.exists():
            shutil.rmtree(out)
        tmp.replace(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
