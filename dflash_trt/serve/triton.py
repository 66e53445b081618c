"""Start and stop the real tritonserver (Triton 2.51, as the nvidia-pytriton wheel ships it).

research/trt.md §5 and §8: the bundled binary needs its Python-backend stub for our Python version
next to libtriton_python.so, this interpreter's bin/ first on PATH and its libpython on
LD_LIBRARY_PATH (else the stub embeds a different Python and every tensor exchange breaks), and
numpy < 2 inside the stub. The stub's embedded interpreter ignores PYTHONPATH and takes its paths
from the `python3` first on PATH, so we give it a throw-away venv of its own (`stub_env`) whose
site-packages puts a directory holding numpy 1.26 before this environment's packages; this process
keeps numpy 2.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from dflash_trt.errors import DFlashError
from dflash_trt.serve.config import TRITON_MODEL, stub_numpy_dir

INSTALL_HINT = "run scripts/setup.sh, or: pip install 'dflash-trt[serve]' && pip install --no-deps nvidia-pytriton==0.7.0"


@dataclass(frozen=True)
class TritonInstall:
    binary: Path
    backends: Path  # holds python/libtriton_python.so and triton_python_backend_utils.py
    stub: Path  # triton_python_backend_stub for this Python version
    numpy_dir: Path


def find_triton() -> TritonInstall:
    """The pieces of the nvidia-pytriton wheel we run (found without importing pytriton, whose own
    dependencies we do not install), or one line on what is missing."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise DFlashError(f"serve needs Triton's server binary (the nvidia-pytriton wheel): {INSTALL_HINT}")
    root = Path(list(spec.submodule_search_locations)[0]) / "tritonserver"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    install = TritonInstall(root / "bin" / "tritonserver", root / "backends",
                            root / "python_backend_stubs" / version / "triton_python_backend_stub", stub_numpy_dir())
    for path in (install.binary, install.backends / "python" / "libtriton_python.so", install.stub):
        if not path.is_file():
            raise DFlashError(f"Triton is incomplete: {path} is missing (Python {version} stub?); {INSTALL_HINT}")
    if not (install.numpy_dir / "numpy").is_dir():
        raise DFlashError(f"Triton's Python stub needs numpy 1.26 in {install.numpy_dir} (it garbles strings with "
                          f"numpy 2): pip install --no-deps --target {install.numpy_dir} numpy==1.26.4")
    return install


def backend_dir(install: TritonInstall, root: Path) -> Path:
    """root/python/ = the wheel's Python backend plus the stub for our Python, as links: the wheel's
    own directory stays untouched (the stub must sit next to libtriton_python.so)."""
    python = root / "python"
    python.mkdir(parents=True, exist_ok=True)
    for source in (install.backends / "python" / "libtriton_python.so",
                   install.backends / "python" / "triton_python_backend_utils.py", install.stub):
        link = python / source.name
        if not link.exists():
            link.symlink_to(source)
    return root


def stub_env(install: TritonInstall, root: Path) -> Path:
    """A venv for the stub: numpy 1.26 first, then this environment's site-packages
    with their .pth files (the editable install of dflash_trt among them) -> its bin/ directory."""
    import venv

    venv.create(root, with_pip=False, symlinks=True, clear=True)
    purelib = sysconfig.get_path("purelib", vars={"base": str(root), "platbase": str(root)})
    ours = sysconfig.get_path("purelib")
    lines = [str(install.numpy_dir), f"import site; site.addsitedir({ours!r})"]
    (Path(purelib) / "dflash_trt_stub.pth").write_text("\n".join(lines) + "\n")
    return root / "bin"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@dataclass
class TritonServer:
    """A running tritonserver on loopback ports; `url` serves HTTP (generate, generate_stream)."""

    process: subprocess.Popen
    http_port: int
    grpc_port: int
    metrics_port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_ready(self, timeout: float) -> None:
        """Until the model is READY; a server that exits or never gets there is one error line + its log."""
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise DFlashError(f"tritonserver exited ({self.process.returncode}) while loading the model; "
                                  f"its log ({self.log}) ends:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/v2/models/{TRITON_MODEL}/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        raise DFlashError(f"the model was not ready within {timeout:.0f} s; tritonserver's log ({self.log}) ends:\n"
                          f"{self.log_tail()}")

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM: Triton stops taking requests, lets in-flight ones finish (the model's finalize
        drains the engine) and exits; killed if it takes longer than `timeout`."""
        return terminate(self.process, timeout)


def _die_with_parent() -> None:
    """In the child: SIGTERM when the parent dies, so a killed `serve` leaves no tritonserver behind."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def start_triton(repository: Path, workdir: Path, install: TritonInstall | None = None,
                 exit_timeout_s: int = 30) -> TritonServer:
    install = install or find_triton()
    http, grpc, metrics = free_port(), free_port(), free_port()
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(stub_env(install, workdir / "stub-env")), env.get("PATH", "")])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [sysconfig.get_config_var("LIBDIR"),
                                                           env.get("LD_LIBRARY_PATH")]))
    env.pop("PYTHONPATH", None)
    command = [
        str(install.binary), f"--model-repository={repository}",
        f"--backend-directory={backend_dir(install, workdir / 'backends')}",
        "--http-address=127.0.0.1", f"--http-port={http}",
        "--grpc-address=127.0.0.1", f"--grpc-port={grpc}",
        "--allow-metrics=true", "--allow-gpu-metrics=false", "--allow-cpu-metrics=false",
        "--metrics-address=127.0.0.1", f"--metrics-port={metrics}",
        f"--exit-timeout-secs={exit_timeout_s}", "--strict-readiness=true",
    ]
    log = workdir / "tritonserver.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=env, cwd=workdir, preexec_fn=_die_with_parent)
    return TritonServer(process, http, grpc, metrics, log)


def terminate(process: subprocess.Popen, timeout: float) -> int:
    """SIGTERM, then SIGKILL if `process` has not exited within `timeout` s -> its exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode
