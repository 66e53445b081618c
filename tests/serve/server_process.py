"""Start `dflash-trt serve` as a real process for tests and read its one ready line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dflash_trt.errors import DFlashError
from dflash_trt.serve.triton import find_triton, free_port, terminate

READY = re.compile(r"serving '(?P<model>[^']+)' at (?P<url>\S+) \(Triton at (?P<triton>[^)]+)\)")


def need_triton() -> None:
    try:
        find_triton()
    except DFlashError as err:
        pytest.skip(f"Triton is not installed here: {err}")


@dataclass
class ServerProcess:
    process: subprocess.Popen
    model: str
    url: str  # .../v1
    triton: str
    output: list[str] = field(default_factory=list)

    @property
    def root(self) -> str:
        return self.url.removesuffix("/v1")

    def children(self) -> list[int]:
        path = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        return [int(pid) for pid in path.read_text().split()] if path.exists() else []

    def stop(self, timeout: float = 60) -> int:
        return terminate(self.process, timeout)


def start_server(args: list[str], timeout: float = 240) -> ServerProcess:
    """`dflash-trt serve ARGS --port <free>` -> the running server, once it printed its ready line."""
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen([sys.executable, "-m", "dflash_trt.cli", "serve", *args, "--port", str(port)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[str] = []
    found = threading.Event()

    def read():
        for line in process.stdout:
            lines.append(line.rstrip())
            if READY.search(line):
                found.set()

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + timeout
    while not found.is_set() and process.poll() is None and time.monotonic() < deadline:
        found.wait(0.2)
    if not found.is_set():
        process.kill()
        raise AssertionError("serve did not become ready:\n" + "\n".join(lines[-30:]))
    match = next(READY.search(line) for line in lines if READY.search(line))
    return ServerProcess(process, match["model"], match["url"], match["triton"], lines)
