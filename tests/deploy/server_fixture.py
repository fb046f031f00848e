# Starts the real flux2_server (tiny checkpoint, CPU backend) on free loopback ports and waits for readiness
# with the server's own probe mode; used by the deploy tests that need a live server (metrics, Prometheus).
import os
import pathlib
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

from deploy_common import LOADGEN, PYTHON, REPO


def server_binary() -> pathlib.Path:
    """The flux2_server built by this CMake tree (FLUX2_SERVER is set by tests/deploy/CMakeLists.txt)."""
    path = os.environ.get("FLUX2_SERVER")
    assert path, "FLUX2_SERVER is not set: the flux2_server target does not exist in this build"
    path = pathlib.Path(path)
    assert path.is_file(), f"{path} does not exist: build the flux2_server target first"
    return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Flux2Server:
    """Context manager: flux2_server on 127.0.0.1 with free gRPC and metrics ports, ready on enter,
    SIGTERM on exit (exit_code holds the process's exit status)."""

    def __init__(self, *extra_args: str, ready_timeout_s: float = 180.0):
        self.binary = server_binary()
        self.grpc_port, self.metrics_port, self.http_port = free_port(), free_port(), free_port()
        self.extra_args = list(extra_args)
        self.ready_timeout_s = ready_timeout_s
        self.exit_code = None
        self._log = tempfile.NamedTemporaryFile(prefix="flux2_server.", suffix=".log", delete=False)

    @property
    def grpc_addr(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def log(self) -> str:
        return pathlib.Path(self._log.name).read_text(errors="replace")

    def probe(self, service: str) -> bool:
        r = subprocess.run([str(self.binary), "--probe", service, "--addr", self.grpc_addr],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
        return r.returncode == 0

    def __enter__(self):
        args = [str(self.binary), "--host", "127.0.0.1", "--port", str(self.grpc_port),
                "--metrics-port", str(self.metrics_port), "--http-port", str(self.http_port),
                "--backend", "cpu", *self.extra_args]
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, cwd=REPO)
        deadline = time.monotonic() + self.ready_timeout_s
        while not self.probe("readiness"):
            if self.proc.poll() is not None:
                raise AssertionError(f"flux2_server exited with {self.proc.returncode} before readiness:\n"
                                     f"{' '.join(args)}\n{self.log()}")
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"flux2_server not ready after {self.ready_timeout_s:.0f} s:\n{self.log()}")
            time.sleep(0.25)
        return self

    def stop(self, timeout_s: float = 60.0) -> int:
        if self.exit_code is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.exit_code = self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.exit_code = self.proc.wait()
        return self.exit_code

    def __exit__(self, *exc):
        self.stop()
        os.unlink(self._log.name)
        return False

    def scrape(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=10) as r:
            return r.read().decode()

    def loadgen(self, request: str, requests: int, concurrency: int = 1, duration_s: float = 300.0,
                method: str = "GenerateImage") -> dict:
        """Runs deploy/loadgen/flux2_loadgen.py against this server and returns its JSON report."""
        import json
        with tempfile.TemporaryDirectory() as tmp:
            out = pathlib.Path(tmp) / "report.json"
            r = subprocess.run([PYTHON, str(LOADGEN), "--target", self.grpc_addr, "--method", method,
                                "-c", str(concurrency), "-n", str(requests), "-d", str(duration_s),
                                "--request", request, "--json-out", str(out)],
                               capture_output=True, text=True, timeout=duration_s + 60)
            assert r.returncode == 0, f"loadgen failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
            return json.loads(out.read_text())
