#!/usr/bin/python3
"""Hostile clients against flux2_server's HTTP API: one test per defect D1-D25 that a hostile-client
probe found in the old cpp-httplib front end (46 attacks, 25 defects; each test's docstring names
its defect and the attack it replays), plus the per-client connection cap. Each test asserts what
the server must do; against the old front end every D-test failed, quickly (every wait is
bounded, and each test has a hard wall-clock limit that dumps the stacks and exits).

Python 3 stdlib only, loopback only. The servers run on the CPU backend with the tiny checkpoint:
one shared instance for most tests, plus fresh ones where a test needs its own flags or kills it
(D1 SIGTERMs its own, D10 hogs its worker, D3/D19 need a token, the connection-cap test its cap).
Flags the fixed server adds (--http-head-timeout-s, --http-idle-timeout-s,
--http-max-connections-per-client) are passed only when `flux2_server --help` lists them.

Measurements: peak RSS is VmHWM from /proc/PID/status after `echo 5 > /proc/PID/clear_refs`
(the idle baseline is VmRSS right before the attack); a guard thread SIGKILLs the server if its RSS
passes the baseline + 600 MB (today's server inflates a gzip bomb to 6 GB), and the next test gets
a fresh server. "Counted" means the sum of flux2_requests_total over all labels went up by exactly
the number of requests (successful GETs of /health, /ready, /openapi.json and /v1/models are not
counted today and must stay uncounted; every refusal, whatever its route, is counted once).
Hang-ups that must cancel (D7's second half, D10) are RSTs (SO_LINGER 0): a plain FIN cannot be
told from the half-close D7 requires the server to answer.

Run: python3 tests/server/http_hostile_test.py --server build/bin/flux2_server
     [--model-dir tests/data/tiny-klein/checkpoint] [-k d05]      (ctest: server_http_hostile)
"""
import argparse
import base64
import ctypes
import faulthandler
import gzip
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request
import zlib

ARGS = None
KiB = 1 << 10
MiB = 1 << 20
LIMIT = 48 * MiB          # --max-request-bytes default (the shared server keeps it)
TOKEN = "s3cr3t-token"    # the auth server's bearer token
HEAD_TIMEOUT_S = 2        # --http-head-timeout-s for the test servers (when the flag exists)
RSS_SLACK_MB = 100        # an attack may raise peak RSS this much over idle
RSS_GUARD_MB = 600        # ... and past this the guard kills the server (protects the host)
SMALL = b'{"prompt":"x","size":"64x64"}'  # a valid, fast generation (29 bytes, 0x1d)
GENERATIONS = "/v1/images/generations"
EDITS = "/v1/images/edits"


class NoAnswer(AssertionError):
    """The server did not answer (timeout, or the connection closed first): a test failure."""


# ---- raw HTTP/1.1 over a socket

class Response:
    def __init__(self, version, status, reason, headers, body):
        self.version, self.status, self.reason, self.headers, self.body = version, status, reason, headers, body

    def header(self, name):
        values = self.header_values(name)
        return values[0] if values else None

    def header_values(self, name):
        return [v for k, v in self.headers if k.lower() == name.lower()]

    def json(self):
        body = self.body
        if (self.header("Content-Encoding") or "").lower() == "gzip":
            body = gzip.decompress(body)
        return json.loads(body)

    def __repr__(self):
        return f"<{self.status} {self.body[:300]!r}{'...' if len(self.body) > 300 else ''}>"


class Conn:
    """One client connection: sends bytes, reads pipelined responses with deadlines (select, so
    another thread may send on a dup of the socket meanwhile)."""

    def __init__(self, port, source=None, timeout=10.0):
        try:
            self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout,
                                                 source_address=(source, 0) if source else None)
        except OSError as error:
            raise NoAnswer(f"cannot connect to port {port}: {error}") from None
        self.buf = bytearray()
        self.eof = False
        self.reset = False
        self.first_data = None   # monotonic time of the first byte received
        self.on_first_data = None

    def send(self, data):
        try:
            self.sock.sendall(data)
        except OSError as error:
            raise NoAnswer(f"send failed ({error.__class__.__name__}): the server closed the connection") from None

    def try_send(self, data):
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            return False

    def _fill(self, deadline):
        """Reads more into buf; False at EOF; NoAnswer at the deadline."""
        if self.eof:
            return False
        remaining = max(0.0, deadline - time.monotonic())  # 0: only what has arrived
        if not select.select([self.sock], [], [], remaining)[0]:
            raise NoAnswer("timed out")
        try:
            chunk = self.sock.recv(1 << 20)
        except ConnectionResetError:
            self.reset, chunk = True, b""
        except OSError:
            chunk = b""
        if not chunk:
            self.eof = True
            return False
        if self.first_data is None:
            self.first_data = time.monotonic()
            if self.on_first_data:
                self.on_first_data()
        self.buf += chunk
        return True

    def poll_input(self):
        """Takes whatever has arrived, without waiting."""
        while not self.eof and select.select([self.sock], [], [], 0)[0]:
            self._fill(time.monotonic() + 1)

    def _need(self, n, deadline, what):
        while len(self.buf) < n:
            if not self._fill(deadline):
                raise NoAnswer(f"connection closed in the middle of {what}")

    def _line(self, deadline):
        while True:
            at = self.buf.find(b"\r\n")
            if at >= 0:
                line = bytes(self.buf[:at])
                del self.buf[:at + 2]
                return line
            if not self._fill(deadline):
                raise NoAnswer("connection closed in the middle of a line")

    def read_response(self, timeout, allow_close=False, max_body=96 * MiB, head_request=False):
        """The next complete response (interim 1xx ones skipped). At EOF before its first byte:
        None if allow_close, else NoAnswer. NoAnswer after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                while b"\r\n\r\n" not in self.buf:
                    if not self._fill(deadline):
                        if not self.buf and allow_close:
                            return None
                        raise NoAnswer("the connection closed without a (complete) response" +
                                       (f" after {bytes(self.buf[:200])!r}" if self.buf else "") +
                                       (" (reset)" if self.reset else ""))
            except NoAnswer as error:
                if str(error) == "timed out":
                    raise NoAnswer(f"no response within {timeout:.1f} s") from None
                raise
            head_end = self.buf.find(b"\r\n\r\n")
            head = bytes(self.buf[:head_end]).decode("latin-1").split("\r\n")
            del self.buf[:head_end + 4]
            parts = head[0].split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
                raise NoAnswer(f"not an HTTP response: {head[0]!r}")
            status = int(parts[1])
            headers = []
            for line in head[1:]:
                name, _, value = line.partition(":")
                headers.append((name.strip(), value.strip()))
            response = Response(parts[0], status, parts[2] if len(parts) > 2 else "", headers, b"")
            if 100 <= status < 200:
                continue
            try:
                response.body = self._body(response, deadline, max_body, head_request)
            except NoAnswer as error:
                if str(error) == "timed out":
                    raise NoAnswer(f"the response body did not arrive within {timeout:.1f} s") from None
                raise
            return response

    def _body(self, response, deadline, max_body, head_request):
        if head_request or response.status in (204, 304):
            return b""
        if "chunked" in (response.header("Transfer-Encoding") or "").lower():
            body = bytearray()
            while True:
                size = int(self._line(deadline).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self._line(deadline):  # trailer fields, then the empty line
                        pass
                    return bytes(body)
                self._need(size + 2, deadline, "a chunk")
                body += self.buf[:size]
                del self.buf[:size + 2]
                if len(body) > max_body:
                    raise NoAnswer(f"response body over {max_body} bytes")
        length = response.header("Content-Length")
        if length is not None:
            n = int(length)
            if n > max_body:
                raise NoAnswer(f"response body of {n} bytes (over {max_body})")
            self._need(n, deadline, "the body")
            body = bytes(self.buf[:n])
            del self.buf[:n]
            return body
        while self._fill(deadline):  # delimited by the close
            if len(self.buf) > max_body:
                raise NoAnswer(f"response body over {max_body} bytes")
        body = bytes(self.buf)
        self.buf.clear()
        return body

    def wait_closed(self, timeout, keep=False):
        """True when the server closes (EOF or reset) within `timeout`; what arrives is discarded
        unless keep."""
        deadline = time.monotonic() + timeout
        try:
            while self._fill(deadline):
                if not keep:
                    self.buf.clear()
        except NoAnswer:
            return False
        return True

    def hang_up_with_reset(self):
        """close() with SO_LINGER 0: the peer sees a RST (unlike a FIN, never taken for a half-close)."""
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.close()

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


class Sender(threading.Thread):
    """Sends `pieces` (an iterable of bytes) on a dup of conn's socket while the test reads."""

    def __init__(self, conn, pieces, send_timeout=20.0):
        super().__init__(daemon=True)
        self.sock = conn.sock.dup()
        self.sock.settimeout(send_timeout)
        self.pieces = pieces
        self.sent = 0
        self.done_at = None
        self.error = None
        self.stop = False

    def run(self):
        try:
            for piece in self.pieces:
                if self.stop:
                    return
                self.sock.sendall(piece)
                self.sent += len(piece)
            self.done_at = time.monotonic()
        except OSError as error:
            self.error = error
        finally:
            self.sock.close()

    def finish(self, conn):
        """Stops sending: shuts the connection down, so a blocked sendall returns."""
        self.stop = True
        try:
            conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.join(timeout=10)


def json_field(response, name):
    """response's JSON object's `name`, None if it is not a JSON object."""
    try:
        value = response.json()
    except (ValueError, OSError):
        return None
    return value.get(name) if isinstance(value, dict) else None


def request(method, path, headers=(), body=None, version="HTTP/1.1", host=True, length=True):
    """Raw request bytes; headers are (name, value) pairs, repeats allowed, sent as given."""
    lines = [f"{method} {path} {version}".encode("latin-1")]
    if host:
        lines.append(b"Host: x")
    for name, value in headers:
        lines.append(name.encode("latin-1") + b": " +
                     (value if isinstance(value, bytes) else value.encode("latin-1")))
    if body is not None and length:
        lines.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + (body or b"")


def get(path, headers=(), close=False):
    return request("GET", path, list(headers) + ([("Connection", "close")] if close else []))


def post(body, path=GENERATIONS, headers=(), content_type="application/json"):
    if not isinstance(body, bytes):
        body = json.dumps(body).encode()
    return request("POST", path, [("Content-Type", content_type)] + list(headers), body)


def exchange(port, raw, timeout=10.0, source=None, allow_close=False, max_body=96 * MiB):
    """One request on a fresh connection; the response (None: closed, if allow_close)."""
    conn = Conn(port, source=source)
    try:
        conn.send(raw)
        return conn.read_response(timeout, allow_close=allow_close, max_body=max_body)
    finally:
        conn.close()


def chunked(data, piece=64 * KiB):
    out = bytearray()
    for at in range(0, len(data), piece):
        part = data[at:at + piece]
        out += b"%x\r\n" % len(part) + part + b"\r\n"
    return bytes(out + b"0\r\n\r\n")


def multipart(parts, boundary="hostileBoundary42"):
    """(content type, body) of a form; each part is (disposition header value or None, bytes)."""
    body = bytearray()
    for disposition, data in parts:
        body += b"--" + boundary.encode() + b"\r\n"
        if disposition is not None:
            body += b"Content-Disposition: " + disposition.encode() + b"\r\n"
        body += b"\r\n" + data + b"\r\n"
    body += b"--" + boundary.encode() + b"--\r\n"
    return f"multipart/form-data; boundary={boundary}", bytes(body)


def field(name, value):
    return f'form-data; name="{name}"', value if isinstance(value, bytes) else value.encode()


def png_gray(width, height):
    """An 8-bit RGB PNG, all mid-gray."""
    rows = (b"\x00" + b"\x80" * (3 * width)) * height

    def chunk(kind, payload):
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def gzip_bomb(mib=1400):
    """A valid gzip stream of '{"prompt":"aaa…"}' with `mib` MiB of a's (1.4 MB for 1400): the
    deflate blocks of one MiB are repeated after full flushes (no history across them)."""
    a = b"a" * MiB
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = c.compress(b'{"prompt":"') + c.flush(zlib.Z_FULL_FLUSH)
    block = c.compress(a) + c.flush(zlib.Z_FULL_FLUSH)
    tail = c.compress(b'"}') + c.flush()
    crc = zlib.crc32(b'{"prompt":"')
    for _ in range(mib):
        crc = zlib.crc32(a, crc)
    crc = zlib.crc32(b'"}', crc)
    size = 11 + mib * MiB + 2
    return (b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + head + block * mib + tail +
            struct.pack("<II", crc, size & 0xFFFFFFFF))


def logfmt(text):
    """(key, value) pairs of a logfmt line (values bare or double-quoted with backslash escapes);
    bare words give (word, None)."""
    pairs, i = [], 0
    key_re = re.compile(r"([^\s=\"]+)=")
    while i < len(text):
        if text[i] == " ":
            i += 1
            continue
        m = key_re.match(text, i)
        if not m:
            j = text.find(" ", i)
            j = len(text) if j < 0 else j
            pairs.append((text[i:j], None))
            i = j
            continue
        key, i = m.group(1), m.end()
        if i < len(text) and text[i] == '"':
            i += 1
            value = []
            while i < len(text) and text[i] != '"':
                if text[i] == "\\" and i + 1 < len(text):
                    value.append(text[i + 1])
                    i += 2
                else:
                    value.append(text[i])
                    i += 1
            i += 1
            pairs.append((key, "".join(value)))
        else:
            j = text.find(" ", i)
            j = len(text) if j < 0 else j
            pairs.append((key, text[i:j]))
            i = j
    return pairs


# ---- the server under test

_FLAGS = None


def server_flags():
    """The --flags `flux2_server --help` lists."""
    global _FLAGS
    if _FLAGS is None:
        out = subprocess.run([ARGS.server, "--help"], capture_output=True, text=True, timeout=30)
        _FLAGS = set(re.findall(r"--[a-z0-9][a-z0-9-]*", out.stdout + out.stderr))
    return _FLAGS


def optional_flags(**flags):
    """`--name value` for each flag the server knows (names with _ for -)."""
    args = []
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        if flag in server_flags():
            args += [flag, str(value)]
    return args


def _die_with_parent():
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: no orphan after a hard timeout


class Server:
    """flux2_server on free loopback ports, CPU backend, no warm-up, queue depth 4; ready once
    GET /ready answers 200. stderr (the access log) goes to a file."""

    def __init__(self, *extra, name="shared"):
        self.name = name
        self.log = tempfile.NamedTemporaryFile(prefix=f"{name}-", suffix=".log", dir=_TMP.name, delete=False)
        args = [ARGS.server, "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0", "--http-port", "0",
                "--backend", "cpu", "--warmup-steps", "0", "--queue-depth", "4"]
        if ARGS.model_dir:
            args += ["--model-dir", ARGS.model_dir]
        args += list(extra)
        self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=self.log, text=True, preexec_fn=_die_with_parent)
        self.pid = self.process.pid
        ports, found = {}, threading.Event()

        def read_stdout():  # then drains it, so the server never blocks on a full pipe
            try:
                for line in self.process.stdout:
                    m = re.search(r"listening grpc=(\d+) metrics=(\d+) http=(\d+)", line)
                    if m and not found.is_set():
                        ports["metrics"], ports["http"] = int(m.group(2)), int(m.group(3))
                        found.set()
            except (OSError, ValueError):  # closed by kill()
                pass
            found.set()

        threading.Thread(target=read_stdout, daemon=True).start()
        if not found.wait(60) or "http" not in ports:
            self.kill()
            raise RuntimeError(f"{name} server did not print its ports; log: {self.log_text()[-2000:]}")
        self.http, self.metrics_port = ports["http"], ports["metrics"]
        deadline = time.monotonic() + 120
        while True:
            try:
                if exchange(self.http, get("/ready"), timeout=2).status == 200:
                    break
            except NoAnswer:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"{name} server never became ready; log: {self.log_text()[-2000:]}")
            time.sleep(0.05)

    def alive(self):
        return self.process.poll() is None

    def healthy(self, timeout=5.0):
        try:
            return self.alive() and exchange(self.http, get("/health"), timeout=timeout).status == 200
        except NoAnswer:
            return False

    def status_kb(self, key):
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
        raise KeyError(key)

    def scrape(self):
        """{(name, ((label, value), ...)): value} of /metrics."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:
            text = r.read().decode()
        samples = {}
        for line in text.splitlines():
            m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$", line)
            if m and not line.startswith("#"):
                labels = tuple(sorted(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or "")))
                samples[(m.group(1), labels)] = float(m.group(3))
        return samples

    def requests_total(self, **match):
        """flux2_requests_total summed over the labels that match `match`."""
        return sum(v for (name, labels), v in self.scrape().items() if name == "flux2_requests_total" and
                   all(dict(labels).get(k) == want for k, want in match.items()))

    def gauge(self, name):
        return sum(v for (n, _), v in self.scrape().items() if n == name)

    def wait_gauge(self, name, value, timeout):
        """Seconds until the gauge equals value (polled every 50 ms), None after timeout."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.gauge(name) == value:
                return time.monotonic() - start
            time.sleep(0.05)
        return None

    def log_text(self):
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def kill(self):
        if self.process.poll() is None:
            self.process.kill()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.process.stdout.close()

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        self.kill()


_SERVERS = {}


def shared(kind="shared"):
    """The shared server (or the token one, kind "auth"), restarted if a test left it dead or deaf."""
    server = _SERVERS.get(kind)
    if server is not None and server.healthy():
        return server
    if server is not None:
        server.kill()
    extra = optional_flags(http_head_timeout_s=HEAD_TIMEOUT_S)
    if kind == "auth":
        token_file = os.path.join(_TMP.name, "token")
        with open(token_file, "w") as f:
            f.write(TOKEN + "\n")
        extra += ["--auth-token-file", token_file, "--allow-insecure-token"]
    server = _SERVERS[kind] = Server(*extra, name=kind)
    return server


class RssGuard:
    """Peak RSS of the server during a block, over its idle RSS right before; SIGKILLs it past
    RSS_GUARD_MB (the attack failed, and the host must survive it)."""

    def __init__(self, server):
        self.server = server
        self.killed = False
        self.max_kb = 0

    def __enter__(self):
        with open(f"/proc/{self.server.pid}/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS
        self.idle_kb = self.server.status_kb("VmRSS")
        self.max_kb = self.idle_kb
        self.running = True
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def _watch(self):
        while self.running:
            try:
                rss = self.server.status_kb("VmRSS")
            except (OSError, KeyError):
                return
            self.max_kb = max(self.max_kb, rss)
            if rss - self.idle_kb > RSS_GUARD_MB * 1024:
                self.killed = True
                self.server.kill()
                return
            time.sleep(0.02)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join(timeout=5)
        try:
            self.max_kb = max(self.max_kb, self.server.status_kb("VmHWM"))
        except (OSError, KeyError):
            pass
        return False

    @property
    def growth_mb(self):
        return (self.max_kb - self.idle_kb) / 1024


def limit_s(seconds):
    """The hard wall-clock limit of one test (the process dumps its stacks and exits past it)."""
    def mark(test):
        test.limit_s = seconds
        return test
    return mark


class HostileTest(unittest.TestCase):
    maxDiff = 4000

    def setUp(self):
        limit = getattr(getattr(self, self._testMethodName), "limit_s", 60)
        faulthandler.dump_traceback_later(limit, exit=True)
        self.started = time.monotonic()

    def tearDown(self):
        faulthandler.cancel_dump_traceback_later()
        sys.stderr.write(f"[{self._testMethodName[5:8]}: {time.monotonic() - self.started:.1f} s] ")

    # -- assertions

    def assert_error(self, response, statuses, param=..., what="", generic_ok=False):
        """An OpenAI error: status in `statuses`, JSON {"error": {message, type, param, code}} with a
        message that says more than "HTTP 400"; param checked unless `...`. Returns the error."""
        what = f"{what}: " if what else ""
        self.assertIsNotNone(response, f"{what}the connection closed without a response")
        statuses = (statuses,) if isinstance(statuses, int) else tuple(statuses)
        self.assertIn(response.status, statuses, f"{what}got {response!r}")
        self.assertIn("application/json", response.header("Content-Type") or "", f"{what}{response!r}")
        try:
            error = response.json()["error"]
        except (ValueError, KeyError, TypeError):
            self.fail(f"{what}not an OpenAI error body: {response!r}")
        self.assertIsInstance(error, dict, f"{what}{response!r}")
        self.assertLessEqual({"message", "type", "param", "code"}, set(error), f"{what}{response!r}")
        self.assertIsInstance(error["message"], str)
        self.assertTrue(error["message"].strip(), f"{what}empty message")
        if not generic_ok:
            self.assertNotRegex(error["message"], r"^HTTP \d{3}$", f"{what}a generic message")
        if param is not ...:
            self.assertEqual(error["param"], param, f"{what}{response!r}")
        return error

    def assert_counted(self, server, before, n=1, what="", **match):
        """flux2_requests_total (over the labels matching `match`) rose by exactly n."""
        deadline = time.monotonic() + 1.0
        while True:
            delta = server.requests_total(**match) - before
            if delta >= n or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.assertEqual(delta, n, f"{what}: flux2_requests_total{match or ''} rose by {delta:g}, not {n}")

    def assert_rss(self, guard, what=""):
        self.assertFalse(guard.killed, f"{what}: peak RSS passed idle + {RSS_GUARD_MB} MB "
                                       f"(the guard killed the server)")
        self.assertLessEqual(guard.growth_mb, RSS_SLACK_MB,
                             f"{what}: peak RSS {guard.growth_mb:.0f} MB over idle")

    def assert_ok_image(self, response, size="64x64", what=""):
        self.assertIsNotNone(response, f"{what}: the connection closed without a response")
        self.assertEqual(response.status, 200, f"{what}: {response!r}")
        try:
            data = response.json()["data"]
        except (ValueError, KeyError, TypeError, OSError):
            self.fail(f"{what}: not an images response: {response!r}")
        self.assertEqual(data[0]["size"], size)
        self.assertEqual(base64.b64decode(data[0]["b64_json"])[:8], b"\x89PNG\r\n\x1a\n")

    def stream_attack(self, server, pieces, timeout, allow_close=False):
        """Sends pieces from a thread while reading the answer. Returns (response or None when closed,
        seconds from the start to it, bytes sent when its first byte came, the Sender)."""
        conn = Conn(server.http)
        sent_at_answer = []
        sender = Sender(conn, pieces)
        conn.on_first_data = lambda: sent_at_answer.append(sender.sent)
        start = sender.started_at = time.monotonic()
        sender.start()
        try:
            response = conn.read_response(timeout, allow_close=True)
            seconds = time.monotonic() - start
        except NoAnswer as error:
            response, seconds = error, time.monotonic() - start
        finally:
            sender.finish(conn)
            conn.close()
        if isinstance(response, NoAnswer):
            raise NoAnswer(f"{response} (the client had sent {sender.sent} bytes)")
        if response is None and not allow_close:
            raise NoAnswer(f"the connection closed without a response after {seconds:.1f} s "
                           f"(the client had sent {sender.sent} bytes)")
        return response, seconds, (sent_at_answer[0] if sent_at_answer else sender.sent), sender

    # ---- D1-D25

    @limit_s(90)
    def test_d01_drain_answers_in_flight_http(self):
        """D1 (attack 45): SIGTERM 1 s into a ~4 s generation; its full 200 JSON still arrives, exit 0."""
        # 256x256: the bigger the response, the surer today's server loses the race between writing it
        # and the drain shutting the connections down (64x64 loses about half the time, 512x512 always).
        server = Server("--test-step-delay-ms", "600", "--drain-timeout-s", "60", name="d01")
        try:
            conn = Conn(server.http)
            conn.send(post({"prompt": "x", "size": "256x256", "num_inference_steps": 2},
                           headers=[("Accept-Encoding", "gzip")]))
            time.sleep(1.0)
            self.assertEqual(server.gauge("flux2_requests_in_flight"), 1, "harness: the job is not running")
            server.process.send_signal(signal.SIGTERM)
            try:
                response = conn.read_response(30, allow_close=True)
            finally:
                conn.close()
            self.assertIsNotNone(response, "the in-flight generation's connection closed with no response")
            self.assert_ok_image(response, "256x256", what="in-flight generation at SIGTERM")
            self.assertEqual(server.process.wait(timeout=30), 0, "exit code after the drain")
        finally:
            server.kill()

    def test_d02_compressed_bodies_refused_415(self):
        """D2 (attack 11): Content-Encoding gzip/deflate/br/unknown gives 415 before inflating; 1.4 MB bomb."""
        server = shared()
        for encoding, body in [("gzip", gzip.compress(SMALL)), ("deflate", zlib.compress(SMALL)),
                               ("br", SMALL), ("compress", SMALL)]:
            with self.subTest(encoding=encoding):
                before = server.requests_total()
                response = exchange(server.http, post(body, headers=[("Content-Encoding", encoding)]), timeout=5)
                self.assert_error(response, 415, what=f"Content-Encoding: {encoding}")
                self.assert_counted(server, before, what=encoding)
        with self.subTest(encoding="gzip bomb, 1.4 MB -> 1.4 GB"):
            bomb = gzip_bomb()
            before = server.requests_total()
            head = request("POST", GENERATIONS, [("Content-Type", "application/json"),
                                                 ("Content-Encoding", "gzip"),
                                                 ("Content-Length", str(len(bomb)))])
            with RssGuard(server) as guard:
                try:
                    response, seconds, _, _ = self.stream_attack(
                        server, [head] + [bomb[i:i + MiB] for i in range(0, len(bomb), MiB)], timeout=10)
                except NoAnswer as error:
                    response, seconds = error, None
            self.assert_rss(guard, "gzip bomb")
            if isinstance(response, NoAnswer):
                raise response
            self.assert_error(response, 415, what="gzip bomb")
            self.assertLess(seconds, 3.0, "the 415 took long: the body was inflated?")
            self.assert_counted(server, before, what="gzip bomb")

    @limit_s(90)
    def test_d03_chunked_bodies_limited_and_unauthenticated_refused_early(self):
        """D3 (attacks 10, 40): a chunked body over --max-request-bytes gets 413 at the limit; 401 precedes the body."""
        server = shared()
        with self.subTest("chunked body of limit + 64 MiB"):
            total = LIMIT + 64 * MiB
            piece = 256 * KiB

            def pieces():
                yield request("POST", GENERATIONS, [("Content-Type", "application/json"),
                                                    ("Transfer-Encoding", "chunked")])
                yield b"b\r\n" + b'{"prompt":"' + b"\r\n"
                block = b"%x\r\n" % piece + b"a" * piece + b"\r\n"
                for _ in range(total // piece):
                    yield block
                yield b"2\r\n" + b'"}' + b"\r\n0\r\n\r\n"

            before = server.requests_total()
            with RssGuard(server) as guard:
                try:
                    response, seconds, sent, _ = self.stream_attack(server, pieces(), timeout=30)
                except NoAnswer as error:
                    response = error
            self.assert_rss(guard, "chunked body over the limit")
            if isinstance(response, NoAnswer):
                raise response
            self.assert_error(response, 413, what="chunked body over the limit")
            self.assertLess(sent, LIMIT + 40 * MiB,
                            f"the 413 came only after {sent} bytes: the server read past the limit")
            self.assert_counted(server, before, what="chunked 413")
        auth = shared("auth")
        for authorization in [None, "Bearer wrong-token"]:
            for framing in ["Content-Length", "chunked"]:
                with self.subTest(authorization=authorization, framing=framing):
                    headers = [("Content-Type", "application/json")]
                    if authorization:
                        headers.append(("Authorization", authorization))
                    first = b'{"prompt":"' + b"a" * (64 * KiB)
                    if framing == "chunked":
                        headers.append(("Transfer-Encoding", "chunked"))
                        first = b"%x\r\n" % len(first) + first + b"\r\n"
                    else:
                        headers.append(("Content-Length", str(40 * MiB)))
                    before = auth.requests_total()
                    conn = Conn(auth.http)
                    try:
                        # Only the head and 64 KiB of a 40 MiB body: the 401 must not wait for the rest.
                        conn.send(request("POST", GENERATIONS, headers) + first)
                        response = conn.read_response(3.0)
                    finally:
                        conn.close()
                    error = self.assert_error(response, 401, what="no/bad token, body still coming")
                    self.assertEqual(error["type"], "authentication_error")
                    self.assert_counted(auth, before, what="401")

    @limit_s(90)
    def test_d04_request_head_limits(self):
        """D4 (attacks 18, 40, 41): 414 for a request line > 8 KiB, 431 for big or many headers, no buffering."""
        server = shared()
        body = SMALL
        cases = [
            ("request line of 9000 bytes", 414,
             request("POST", GENERATIONS + "?q=" + "a" * 9000, [("Content-Type", "application/json")], body)),
            ("10 headers of 7000 bytes (70 KB)", 431,
             request("POST", GENERATIONS, [("Content-Type", "application/json")] +
                     [(f"X-Pad-{i}", "p" * 7000) for i in range(10)], body)),
            ("150 header fields", 431,
             request("POST", GENERATIONS, [("Content-Type", "application/json")] +
                     [(f"X-H-{i}", "v") for i in range(150)], body)),
            ("one 1 MB header", 431,
             request("POST", GENERATIONS, [("Content-Type", "application/json"), ("X-Big", "b" * MiB)], body)),
        ]
        for what, status, raw in cases:
            with self.subTest(what):
                before = server.requests_total()
                response = exchange(server.http, raw, timeout=5)
                self.assert_error(response, status, what=what)
                self.assert_counted(server, before, what=what)

        def many_headers():
            yield b"POST " + GENERATIONS.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            line = b"X-A: " + b"d" * 8000 + b"\r\n"
            for _ in range(25000 // 25):
                yield line * 25
            yield b"Content-Length: %d\r\n\r\n" % len(body) + body

        def long_line():
            yield b"POST " + GENERATIONS.encode() + b"?q="
            for _ in range(50):
                yield b"a" * MiB
            yield b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body

        for what, pieces, status in [("25,000 x 8 KB headers (200 MB)", many_headers, 431),
                                     ("a 50 MB request line", long_line, 414)]:
            with self.subTest(what):
                server = shared()
                with RssGuard(server) as guard:
                    try:
                        response, seconds, _, _ = self.stream_attack(server, pieces(), timeout=10,
                                                                     allow_close=True)
                    except NoAnswer as error:
                        response, seconds = error, None
                self.assert_rss(guard, what)
                if isinstance(response, NoAnswer):
                    raise response
                if response is not None:  # closing without an answer is also a refusal
                    self.assert_error(response, status, what=what)
                self.assertLess(seconds, 3.0, f"{what}: refused only after {seconds:.1f} s")

    @limit_s(60)
    def test_d05_slow_and_idle_connections_do_not_starve_the_api(self):
        """D5 (attacks 22, 23): 50 heads trickling 1 byte/s + 40 silent connections; probes and a generation still work."""
        server = shared()
        slow, idle = [], []
        try:
            # The attackers come from other loopback addresses than the probes (per-client caps).
            for _ in range(50):
                conn = Conn(server.http, source="127.0.0.2")
                conn.send(b"GET /health HTTP/1.1\r\nHost: x\r\nX-a: ")
                slow.append(conn)
            for _ in range(40):
                idle.append(Conn(server.http, source="127.0.0.3"))
            start = time.monotonic()
            generated = {}

            def generate():
                try:
                    generated["response"] = exchange(server.http, post(SMALL), timeout=10)
                except NoAnswer as error:
                    generated["error"] = str(error)

            generation = threading.Thread(target=generate, daemon=True)
            failures, probes, next_byte = [], 0, start + 1
            while time.monotonic() - start < 7:
                if time.monotonic() >= next_byte:
                    next_byte += 1
                    for conn in slow:
                        conn.poll_input()
                        if not conn.eof and not conn.buf:
                            conn.try_send(b"a")
                if not generation.is_alive() and "response" not in generated and time.monotonic() - start > 1:
                    generation.start()
                for path in ("/health", "/ready"):
                    at = time.monotonic() - start
                    try:
                        response = exchange(server.http, get(path), timeout=1.0)
                        if response.status != 200:
                            failures.append(f"{path} at {at:.1f} s: {response!r}")
                    except NoAnswer as error:
                        failures.append(f"{path} at {at:.1f} s: {error}")
                    probes += 1
                time.sleep(0.25)
            generation.join(timeout=max(0.0, 12 - (time.monotonic() - start)))
            # What the slow heads got: each must have been answered 408 and closed after
            # --http-head-timeout-s (2 s here; the attack lasted 7 s).
            got, deadline = {}, time.monotonic() + 0.5
            for conn in slow:
                closed = conn.wait_closed(deadline - time.monotonic(), keep=True)
                first = bytes(conn.buf[:12]) if conn.buf else b""
                status = first[9:12].decode("latin-1") if first.startswith(b"HTTP/1.") else repr(first)
                key = f"{status}{'' if closed else ' (still open)'}"
                got[key] = got.get(key, 0) + 1
            summary = (f"{len(failures)} of {probes} probes failed; generation: "
                       f"{generated.get('response', generated.get('error'))!r}; the 50 slow heads got {got}")
            self.assertEqual(failures, [], summary)
            self.assertIn("response", generated, summary)
            self.assert_ok_image(generated["response"], what="generation during the attack")
            self.assertEqual(got, {"408": 50}, summary)
        finally:
            for conn in slow + idle:
                conn.close()

    def test_d06_pipelined_requests_all_answered_in_order(self):
        """D6 (attacks 8, 20): 3 pipelined GETs, and 2 generation POSTs + a GET in one write, all answered in order."""
        server = shared()
        with self.subTest("three GETs"):
            conn = Conn(server.http)
            try:
                conn.send(get("/health") + get("/ready") + get("/v1/models", close=True))
                answers = []
                for _ in range(3):
                    answers.append(conn.read_response(4))
            finally:
                conn.close()
            self.assertEqual([(r.status, json_field(r, "status") or json_field(r, "object")) for r in answers],
                             [(200, "live"), (200, "ready"), (200, "list")])
        with self.subTest("two generations and a GET"):
            before = server.requests_total()
            conn = Conn(server.http)
            try:
                conn.send(post(SMALL) + post({"prompt": "y", "size": "64x48"}) + get("/ready", close=True))
                first = conn.read_response(30)
                second = conn.read_response(30)
                third = conn.read_response(10)
            finally:
                conn.close()
            self.assert_ok_image(first, "64x64", what="first pipelined generation")
            if second.status == 200:
                self.assert_ok_image(second, "64x48", what="second pipelined generation")
            else:  # refusing it explicitly is allowed
                self.assert_error(second, range(400, 600), what="second pipelined generation")
            self.assertEqual((third.status, json_field(third, "status")), (200, "ready"), f"{third!r}")
            self.assert_counted(server, before, 2, what="two pipelined generations")

    def test_d07_half_closed_client_still_answered(self):
        """D7 (attacks 19, 43): POST then shutdown(SHUT_WR) still gets the full 200, counted OK."""
        server = shared()
        ok = server.requests_total(code="OK")
        cancelled = server.requests_total(code="CANCELLED")
        conn = Conn(server.http)
        try:
            conn.send(post(SMALL))
            conn.sock.shutdown(socket.SHUT_WR)
            response = conn.read_response(30, allow_close=True)
        finally:
            conn.close()
        self.assertIsNotNone(response, "half-closed client: 0 bytes back")
        self.assert_ok_image(response, what="half-closed client")
        self.assert_counted(server, ok, what="half-closed generation, code OK", code="OK")
        self.assertEqual(server.requests_total(code="CANCELLED") - cancelled, 0, "counted CANCELLED")
        with self.subTest("a client that resets still cancels"):
            conn = Conn(server.http)
            conn.send(post({"prompt": "x", "size": "512x512", "num_inference_steps": 20}))
            running = server.wait_gauge("flux2_requests_in_flight", 1, 10)
            conn.hang_up_with_reset()
            self.assertIsNotNone(running, "harness: the 512x512 generation did not start")
            seconds = server.wait_gauge("flux2_requests_in_flight", 0, 15)
            if seconds is None:
                server.kill()  # do not leave the shared server busy for minutes
            self.assertIsNotNone(seconds, "flux2_requests_in_flight stayed 1 for 15 s after the reset")

    def test_d08_range_requests_ignored(self):
        """D8 (attacks 21, 42): 2700 overlapping ranges on /openapi.json and a generation give the plain 200."""
        server = shared()
        ranges = "bytes=" + ",".join(["0-"] * 2700)
        plain = exchange(server.http, get("/openapi.json"), timeout=5)
        self.assertEqual(plain.status, 200)
        for what, raw in [("/openapi.json", get("/openapi.json", [("Range", ranges)])),
                          ("generation", post(SMALL, headers=[("Range", ranges)]))]:
            with self.subTest(what):
                response = exchange(server.http, raw, timeout=30)
                self.assertEqual(response.status, 200, f"{what}: {response.status}, {len(response.body)} bytes")
                self.assertIsNone(response.header("Content-Range"))
                self.assertIn("application/json", response.header("Content-Type") or "",
                              f"{what}: {response.header('Content-Type')}, {len(response.body)} bytes")
                if what == "/openapi.json":
                    self.assertEqual(response.body, plain.body)
                else:
                    self.assert_ok_image(response, what=what)

    @limit_s(60)
    def test_d09_deep_json_nesting_refused_fast(self):
        """D9 (attack 42): a 48 MiB body of nested arrays in `user` gets 400 param body, fast, bounded memory."""
        server = shared()
        n = LIMIT // 2 - 1024
        body = b'{"prompt":"x","user":' + b"[" * n + b"]" * n + b"}"
        head = request("POST", GENERATIONS, [("Content-Type", "application/json"),
                                             ("Content-Length", str(len(body)))])
        view = memoryview(body)
        before = server.requests_total()
        with RssGuard(server) as guard:
            try:
                response, seconds, _, sender = self.stream_attack(
                    server, [head] + [view[i:i + MiB] for i in range(0, len(body), MiB)], timeout=20)
            except NoAnswer as error:
                response = error
        self.assert_rss(guard, "48 MiB of nesting")
        if isinstance(response, NoAnswer):
            raise response
        self.assert_error(response, 400, param="body", what="48 MiB of nesting")
        body_sent = sender.done_at - sender.started_at if sender.done_at else seconds
        self.assertLess(seconds - min(body_sent, seconds), 3.0,
                        f"the 400 came {seconds:.1f} s after the start, the body was sent in {body_sent:.1f} s")
        self.assert_counted(server, before, what="nesting")

    @limit_s(60)
    def test_d10_hang_up_frees_the_cpu_worker_within_a_few_blocks(self):
        """D10 (attack 4): a big CPU generation whose client hangs up after 2 s leaves the worker within ~2 blocks."""
        # The probe's 2048x2048 cannot be used in a bounded test. Measured on this 2-core host under
        # load ~6 (tiny checkpoint: 2 double + 3 single blocks; per-step time from
        # flux2_denoise_step_duration_seconds): 512x512 2.1 s, 768x768 8.0 s, 1024x1024 25 s a step.
        # Attention dominates: tokens = (W/16)(H/16) + 512 text tokens, time ~ tokens^2 (measured
        # 1024/512 ratio 12; pure quadratic says 9). 2048x2048 has 16896 tokens, 13x the 1024x1024
        # step: ~5 min a step, ~1 min a block, so even a between-blocks check would overrun a 60 s test.
        # So: 1024x1024, the same defect (a cancel only between steps). Here `step512` is measured
        # first (two streamed 512x512 steps); a 1024x1024 step then takes >= 9 x step512 and a block
        # ~1/5 of that. Bound = 4.5 x step512 (half the lower estimate of a step, ~2 blocks): a server
        # that checks between blocks frees the worker within one block (~2.4 x step512) of the
        # hang-up; one that checks between steps only after the rest of the step (>= 9 x step512 - 2 s).
        server = Server(name="d10")
        try:
            conn = Conn(server.http)
            conn.send(post({"prompt": "x", "size": "512x512", "num_inference_steps": 3, "stream": True}))
            # Its second progress event's step_seconds (the first step may pay one-time costs).
            progress = []
            deadline = time.monotonic() + 30
            while len(progress) < 2:
                if not conn._fill(deadline):
                    self.fail("harness: the 512x512 stream ended early")
                lines = bytes(conn.buf).decode("latin-1").split("\n")[:-1]  # complete lines
                progress = [json.loads(line[6:]) for line in lines
                            if line.startswith("data: {") and "image_generation.progress" in line]
            conn.hang_up_with_reset()
            step512 = progress[1]["step_seconds"]
            self.assertIsNotNone(server.wait_gauge("flux2_requests_in_flight", 0, 20), "harness: 512x512 not freed")
            bound = min(max(4.5 * step512, 3.0), 40.0)
            conn = Conn(server.http)
            sent = time.monotonic()
            conn.send(post({"prompt": "x", "size": "1024x1024", "num_inference_steps": 4}))
            self.assertIsNotNone(server.wait_gauge("flux2_requests_in_flight", 1, 5), "harness: 1024x1024 not running")
            time.sleep(max(0.0, 2.0 - (time.monotonic() - sent)))
            conn.hang_up_with_reset()
            seconds = server.wait_gauge("flux2_requests_in_flight", 0, bound)
            self.assertIsNotNone(seconds, f"the worker was still busy {bound:.1f} s after the hang-up "
                                          f"(step512 {step512:.2f} s; bound 4.5 x step512)")
        finally:
            server.kill()

    def test_d11_http_layer_errors_are_openai_json_and_counted(self):
        """D11 (attacks 2, 9, 13, 15, 17): framing errors get a clear OpenAI error and are counted once."""
        server = shared()
        parts = [field("prompt", "x")] * 1025
        many_type, many_body = multipart(parts)
        valid = SMALL
        cases = [
            ("multipart without a boundary",
             request("POST", EDITS, [("Content-Type", "multipart/form-data")], b"x")),
            ("1025 multipart parts",
             request("POST", EDITS, [("Content-Type", many_type)], many_body)),
            ("chunk size zz",
             request("POST", GENERATIONS, [("Content-Type", "application/json"),
                                           ("Transfer-Encoding", "chunked")]) + b"zz\r\n" + valid + b"\r\n0\r\n\r\n"),
            ("chunk size -1",
             request("POST", GENERATIONS, [("Content-Type", "application/json"),
                                           ("Transfer-Encoding", "chunked")]) + b"-1\r\n" + valid + b"\r\n0\r\n\r\n"),
            ("a trailer (200 if accepted)",
             request("POST", GENERATIONS, [("Content-Type", "application/json"),
                                           ("Transfer-Encoding", "chunked")]) +
             chunked(valid)[:-2] + b"X-Trailer: 1\r\n\r\n"),
            ("request line GET / HTTP/1.2", b"GET / HTTP/1.2\r\nHost: x\r\n\r\n"),
            ("request line FOO / HTTP/1.1", b"FOO / HTTP/1.1\r\nHost: x\r\n\r\n"),
            ("request line get /health HTTP/1.1", b"get /health HTTP/1.1\r\nHost: x\r\n\r\n"),
        ]
        for what, raw in cases:
            with self.subTest(what):
                before = server.requests_total()
                response = exchange(server.http, raw, timeout=3)
                if not (what.startswith("a trailer") and response.status == 200):
                    self.assert_error(response, (400, 413, 501, 505), what=what)
                self.assert_counted(server, before, what=what)

    def test_d12_malformed_content_length_400_at_once(self):
        """D12 (attack 8): Content-Length -1, 2^64, 1e23, abc, 1e3, 0x1d gets 400 naming Content-Length within 2 s."""
        server = shared()
        for value in ["-1", "18446744073709551616", "1e23", "abc", "1e3", "0x1d"]:
            with self.subTest(content_length=value):
                raw = (b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: " + value.encode() + b"\r\n\r\n" + SMALL)
                before = server.requests_total()
                response = exchange(server.http, raw, timeout=2.0)
                error = self.assert_error(response, 400, what=f"Content-Length: {value}")
                self.assertIn("content-length", error["message"].lower(), f"Content-Length: {value}")
                self.assert_counted(server, before, what=value)

    def test_d13_ambiguous_framing_refused(self):
        """D13 (attacks 8, 9): two Content-Lengths, TE+CL, chunk data without CRLF: 400; TE gzip, chunked: 501/400."""
        server = shared()
        json_type = ("Content-Type", "application/json")
        cases = [
            ("two different Content-Length", 400,
             request("POST", GENERATIONS, [json_type, ("Content-Length", str(len(SMALL))), ("Content-Length", "5")],
                     SMALL, length=False)),
            ("Transfer-Encoding chunked and Content-Length", 400,
             request("POST", GENERATIONS, [json_type, ("Transfer-Encoding", "chunked"),
                                           ("Content-Length", "5")], chunked(SMALL), length=False)),
            ("chunk data not followed by CRLF", 400,
             request("POST", GENERATIONS, [json_type, ("Transfer-Encoding", "chunked")]) +
             b"%x\r\n" % len(SMALL) + SMALL + b"XX0\r\n\r\n"),
            ("Transfer-Encoding: gzip, chunked", (501, 400),
             request("POST", GENERATIONS, [json_type, ("Transfer-Encoding", "gzip, chunked")]) +
             chunked(gzip.compress(SMALL))),
        ]
        for what, status, raw in cases:
            with self.subTest(what):
                before = server.requests_total()
                response = exchange(server.http, raw, timeout=3)
                self.assert_error(response, status, what=what)
                self.assert_counted(server, before, what=what)

    def test_d14_urlencoded_content_type_same_as_json(self):
        """D14 (attack 12): a 9 KB JSON body sent as x-www-form-urlencoded gets what application/json gets (200)."""
        server = shared()
        body = json.dumps({"prompt": "a" * 8000, "user": "b" * 1000, "size": "64x64"}).encode()
        as_json = exchange(server.http, post(body), timeout=30)
        self.assertEqual(as_json.status, 200, f"harness: application/json gave {as_json!r}")
        as_form = exchange(server.http, post(body, content_type="application/x-www-form-urlencoded"), timeout=30)
        self.assertEqual(as_form.status, as_json.status, f"x-www-form-urlencoded: {as_form!r}")

    def test_d15_multipart_prompt_must_be_utf8(self):
        """D15 (attack 13): an edit whose multipart prompt is \\xff\\xfe gets 400 param prompt."""
        server = shared()
        content_type, body = multipart([field("prompt", b"\xff\xfe"), field("size", "64x64"),
                                        ('form-data; name="image"; filename="a.png"', png_gray(64, 64))])
        before = server.requests_total()
        response = exchange(server.http, post(body, EDITS, content_type=content_type), timeout=30)
        self.assert_error(response, 400, param="prompt", what="invalid UTF-8 prompt")
        self.assert_counted(server, before, what="invalid UTF-8 prompt")

    def test_d16_multipart_field_invalid_utf8_names_the_field(self):
        """D16 (attack 13): an edit whose multipart n is \\xff\\xfe gets 400 param n (not null)."""
        server = shared()
        content_type, body = multipart([field("prompt", "x"), field("n", b"\xff\xfe"), field("size", "64x64"),
                                        ('form-data; name="image"; filename="a.png"', png_gray(64, 64))])
        response = exchange(server.http, post(body, EDITS, content_type=content_type), timeout=30)
        self.assert_error(response, 400, param="n", what="invalid UTF-8 n")

    def test_d17_range_errors_quote_the_value_sent(self):
        """D17 (attacks 1, 5, 6): n 10^12, steps 2^32, compression 2^40, size 2147483648x1, n 1e400: the real value."""
        server = shared()
        cases = [
            ({"prompt": "x", "n": 1000000000000}, "n", "1000000000000", None),
            ({"prompt": "x", "num_inference_steps": 4294967296}, "num_inference_steps", "4294967296", None),
            ({"prompt": "x", "output_format": "jpeg", "output_compression": 1 << 40},
             "output_compression", str(1 << 40), None),
            ({"prompt": "x", "size": "2147483648x1"}, "size", None, "WIDTHxHEIGHT"),
            (b'{"prompt":"x","n":1e400}', "n", None, "is not a JSON object"),
        ]
        for body, param, quoted, not_said in cases:
            with self.subTest(param=param, body=body if isinstance(body, bytes) else json.dumps(body)):
                error = self.assert_error(exchange(server.http, post(body), timeout=10), 400, param=param)
                if quoted:
                    self.assertIn(quoted, error["message"])
                if not_said:
                    self.assertNotIn(not_said, error["message"])

    def test_d18_wrong_method_405_with_allow(self):
        """D18 (attack 17): PUT/DELETE/PATCH on /v1/images/generations give 405 with Allow: POST."""
        server = shared()
        for method in ["PUT", "DELETE", "PATCH"]:
            with self.subTest(method=method):
                before = server.requests_total()
                response = exchange(server.http, request(method, GENERATIONS, [("Content-Type", "application/json")],
                                                         SMALL), timeout=5)
                self.assert_error(response, 405, what=method)
                allowed = [m.strip() for m in (response.header("Allow") or "").split(",")]
                self.assertIn("POST", allowed, f"Allow: {response.header('Allow')}")
                self.assertNotIn(method, allowed)
                self.assert_counted(server, before, what=method)

    def test_d19_bearer_scheme_case_insensitive_and_one_authorization(self):
        """D19 (attack 39): `Authorization: bearer <token>` is accepted; two Authorization headers are refused."""
        server = shared("auth")
        right, wrong = f"Bearer {TOKEN}", "Bearer wrong-token"
        self.assertEqual(exchange(server.http, post(SMALL, headers=[("Authorization", right)]), timeout=30).status,
                         200, "harness: the right token was refused")
        with self.subTest("lower-case scheme"):
            response = exchange(server.http, post(SMALL, headers=[("Authorization", f"bearer {TOKEN}")]), timeout=30)
            self.assertEqual(response.status, 200, f"bearer <token>: {response!r}")
        for order in [(wrong, right), (right, wrong)]:
            with self.subTest(authorization=order):
                before = server.requests_total()
                response = exchange(server.http, post(SMALL, headers=[("Authorization", v) for v in order]),
                                    timeout=30)
                self.assert_error(response, (400, 401), what=f"two Authorization headers {order}")
                self.assert_counted(server, before, what="two Authorization headers")

    def test_d20_request_id_cannot_forge_log_fields(self):
        """D20 (attack 29): X-Request-Id `hostile-d20 code=OK peer=1.2.3.4:1` forges no field of the text log."""
        server = shared()
        request_id = "hostile-d20 code=OK peer=1.2.3.4:1"
        response = exchange(server.http, post(SMALL, headers=[("X-Request-Id", request_id)]), timeout=30)
        if response.status == 400:  # refusing such an id is the other acceptable fix
            self.assert_error(response, 400, param="X-Request-Id")
            return
        self.assertEqual(response.status, 200, f"{response!r}")
        lines = [line for line in server.log_text().splitlines() if "hostile-d20" in line]
        self.assertEqual(len(lines), 1, f"log lines naming the request: {lines}")
        pairs = logfmt(lines[0].split("flux2_server: ", 1)[-1])
        keys = [key for key, value in pairs if value is not None]
        self.assertEqual(keys.count("code"), 1, f"`code` keys in {lines[0]!r}")
        self.assertEqual(keys.count("peer"), 1, f"`peer` keys in {lines[0]!r}")
        self.assertEqual([v for k, v in pairs if k == "request_id"], [request_id], lines[0])

    def test_d21_zero_width_or_height_refused(self):
        """D21 (attack 5): size 0x64 and 64x0 give 400 param size."""
        server = shared()
        for size in ["0x64", "64x0"]:
            with self.subTest(size=size):
                # (1 step: today's server generates it, 1024x64 or 64x1024)
                response = exchange(server.http, post({"prompt": "x", "size": size, "num_inference_steps": 1}),
                                    timeout=30)
                self.assert_error(response, 400, param="size", what=size)

    def test_d22_bad_request_line_closes_the_connection(self):
        """D22 (attacks 17, 19): after the 400 for an unparsable request line, Connection: close and the socket closes."""
        server = shared()
        for raw in [b"FOO / HTTP/1.1\r\n\r\n", b"GET / HTTP/1.2\r\nHost: x\r\n\r\n",
                    b"GET /health HTTP/1.1\nHost: x\n\n"]:
            with self.subTest(request=raw):
                conn = Conn(server.http)
                try:
                    conn.send(raw)
                    response = conn.read_response(2.0)
                    self.assert_error(response, (400, 501, 505), what=repr(raw), generic_ok=True)  # D11's
                    self.assertEqual((response.header("Connection") or "").lower(), "close", f"{raw!r}")
                    self.assertTrue(conn.wait_closed(1.0), f"{raw!r}: the socket stayed open 1 s after the answer")
                finally:
                    conn.close()

    def test_d23_request_timeout_header_strict(self):
        """D23 (attack 28): X-Request-Timeout `0x10` or empty gives 400 param X-Request-Timeout."""
        server = shared()
        for value in ["0x10", ""]:
            with self.subTest(value=value):
                response = exchange(server.http, post(SMALL, headers=[("X-Request-Timeout", value)]), timeout=30)
                self.assert_error(response, 400, param="X-Request-Timeout", what=f"X-Request-Timeout: {value!r}")

    def test_d24_nameless_multipart_part_named_error(self):
        """D24 (attack 13): a multipart part without a name gets 400 with a clear message and a non-empty param."""
        server = shared()
        raw = request("POST", EDITS, [("Content-Type", "multipart/form-data; boundary=b")],
                      b"--b\r\nContent-Disposition: form-data\r\n\r\nx\r\n--b--\r\n")
        error = self.assert_error(exchange(server.http, raw, timeout=10), 400, what="nameless part")
        self.assertIsInstance(error["param"], str)
        self.assertTrue(error["param"], f"empty param: {error}")
        self.assertFalse(error["message"].startswith(":"), f"message: {error['message']!r}")

    def test_d25_duplicate_json_key_refused(self):
        """D25 (attack 1): {"prompt":"x","size":"99999x99999","size":"64x64"} gets 400 naming size."""
        server = shared()
        response = exchange(server.http, post(b'{"prompt":"x","size":"99999x99999","size":"64x64"}'), timeout=30)
        error = self.assert_error(response, 400, what="duplicate key")
        self.assertIn("size", f"{error['param']} {error['message']}", f"{error}")

    # ---- the connection caps the fix adds

    @limit_s(60)
    def test_limits_per_client_connections(self):
        """--http-max-connections-per-client 8: idle keep-alives make room for a 9th; 8 stuck heads do not."""
        if "--http-max-connections-per-client" not in server_flags():
            self.skipTest("flux2_server has no --http-max-connections-per-client")
        server = Server("--http-max-connections-per-client", "8",
                        *optional_flags(http_head_timeout_s=5, http_idle_timeout_s=30), name="limits")
        held = []
        try:
            with self.subTest("8 idle keep-alive connections, then a 9th"):
                for _ in range(8):
                    conn = Conn(server.http)
                    held.append(conn)
                    conn.send(get("/health"))
                    self.assertEqual(conn.read_response(3).status, 200)
                ninth = exchange(server.http, get("/health"), timeout=3, allow_close=True)
                self.assertIsNotNone(ninth, "the 9th connection was closed")
                self.assertEqual(ninth.status, 200, f"{ninth!r}")
                closed = sum(conn.wait_closed(0.2) for conn in held)
                self.assertGreaterEqual(closed, 1, "no idle keep-alive connection was closed to make room")
            for conn in held:
                conn.close()
            held.clear()
            time.sleep(0.3)
            with self.subTest("8 connections stuck mid-head, then a 9th"):
                for _ in range(8):
                    conn = Conn(server.http)
                    held.append(conn)
                    conn.send(b"GET /health HTTP/1.1\r\nHost: x\r\n")
                time.sleep(0.3)
                ninth = exchange(server.http, get("/health"), timeout=2, allow_close=True)
                if ninth is not None:
                    self.assert_error(ninth, 503, what="9th connection beside 8 stuck heads")
                other = exchange(server.http, get("/health"), timeout=2, source="127.0.0.2")
                self.assertEqual(other.status, 200, "another client was refused")
        finally:
            for conn in held:
                conn.close()
            server.kill()


def setUpModule():
    global _TMP
    _TMP = tempfile.TemporaryDirectory(prefix="flux2-hostile-")


def tearDownModule():
    for server in _SERVERS.values():
        server.stop()
    _TMP.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True, help="the flux2_server binary")
    default_checkpoint = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "tiny-klein",
                                      "checkpoint")
    if not os.path.isfile(os.path.join(default_checkpoint, "tokenizer", "tokenizer.json")):
        default_checkpoint = None
    parser.add_argument("--model-dir", default=default_checkpoint,
                        help="checkpoint (default: tests/data/tiny-klein/checkpoint beside this script, "
                             "else the server's embedded one)")
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
