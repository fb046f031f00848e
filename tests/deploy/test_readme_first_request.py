#!/usr/bin/python3
# The README's first-request commands, run as written: flux2_server on its default ports (gRPC 50051, HTTP 8000,
# metrics 9464) as deploy/quickstart.sh starts it, then the lines between README.md's first-request markers in bash
# (curl over HTTP writing fox.png, `buf curl` over gRPC through reflection); fox.png must be a 256x256 PNG and the
# gRPC answer must carry one image. ctest runs it alone (RUN_SERIAL): the default ports are fixed.
import os
import pathlib
import re
import struct
import subprocess
import tempfile
import time
import unittest
import urllib.request

from deploy_common import REPO
from server_fixture import server_binary


def readme_block() -> str:
    text = (REPO / "README.md").read_text()
    match = re.search(r"<!-- first-request[^>]*-->\s*```sh\n(.*?)```\s*<!-- /first-request -->", text, re.S)
    assert match, "README.md has no first-request block"
    return match.group(1)


class ReadmeFirstRequestTest(unittest.TestCase):
    def test_first_request_commands_run_as_written(self):
        server = subprocess.Popen([str(server_binary())], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.time() + 180
            while True:
                try:
                    with urllib.request.urlopen("http://localhost:8000/ready", timeout=5) as reply:
                        if reply.status == 200:
                            break
                except OSError:
                    pass
                self.assertIsNone(server.poll(), "flux2_server exited before it was ready")
                self.assertLess(time.time(), deadline, "flux2_server not ready in 180 s")
                time.sleep(0.2)
            with tempfile.TemporaryDirectory() as work:
                # The commands use repository-relative paths (tests/tools/...); fox.png lands in `work`.
                os.symlink(REPO / "tests", pathlib.Path(work) / "tests")
                run = subprocess.run(["bash", "-euo", "pipefail", "-c", readme_block()], cwd=work,
                                     capture_output=True, text=True, timeout=300)
                self.assertEqual(run.returncode, 0, run.stderr)
                png = (pathlib.Path(work) / "fox.png").read_bytes()
                self.assertEqual(png[:8], b"\x89PNG\r\n\x1a\n")
                self.assertEqual(struct.unpack(">II", png[16:24]), (256, 256))
                self.assertRegex(run.stdout, r"^1 image in [0-9.]+ s\n$")
        finally:
            server.terminate()
            server.wait(timeout=120)


if __name__ == "__main__":
    unittest.main()
