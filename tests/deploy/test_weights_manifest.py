#!/usr/bin/python3
# The weights checksum path: make_weights_manifest.sh writes SHA256SUMS for the tiny checkpoint, and the exact
# verify-weights init-container script from the Deployment accepts it, then rejects a flipped byte and a missing manifest.
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import unittest

from deploy_common import DEPLOY, REPO, the_object

CHECKPOINT = REPO / "tests" / "data" / "tiny-klein" / "checkpoint"


def init_script() -> str:
    pod = the_object("Deployment")["spec"]["template"]["spec"]
    (init,) = [c for c in pod["initContainers"] if c["name"] == "verify-weights"]
    assert init["command"][:2] == ["/bin/sh", "-c"], init["command"]
    return init["command"][2]


class WeightsManifestTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.models = pathlib.Path(self.tmp.name) / "models"
        shutil.copytree(CHECKPOINT, self.models)
        r = subprocess.run([str(DEPLOY / "scripts" / "make_weights_manifest.sh"), str(self.models)],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)

    def tearDown(self):
        self.tmp.cleanup()

    def verify(self) -> subprocess.CompletedProcess:
        # The container mounts the volume at /models; here the copy lives in a temporary directory.
        script = init_script().replace("/models", str(self.models))
        return subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True)

    def test_manifest_lists_every_file(self):
        lines = (self.models / "SHA256SUMS").read_text().splitlines()
        listed = sorted(line.split("  ", 1)[1] for line in lines)
        on_disk = sorted(str(p.relative_to(self.models)) for p in self.models.rglob("*")
                         if p.is_file() and p.name != "SHA256SUMS")
        self.assertEqual(listed, on_disk)
        self.assertIn("transformer/diffusion_pytorch_model.safetensors", listed)
        for line in lines:
            self.assertRegex(line, r"^[0-9a-f]{64}  \S")

    def test_init_container_accepts_intact_weights(self):
        r = self.verify()
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        n = len((self.models / "SHA256SUMS").read_text().splitlines())
        self.assertIn(f"{n} files match", r.stdout)

    def test_init_container_rejects_a_flipped_byte(self):
        weights = self.models / "transformer" / "diffusion_pytorch_model.safetensors"
        data = bytearray(weights.read_bytes())
        data[len(data) // 2] ^= 0x01
        weights.write_bytes(bytes(data))
        r = self.verify()
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("transformer/diffusion_pytorch_model.safetensors: FAILED", r.stdout)

    def test_init_container_rejects_a_missing_file_and_a_missing_manifest(self):
        os.unlink(self.models / "vae" / "config.json")
        self.assertNotEqual(self.verify().returncode, 0)
        os.unlink(self.models / "SHA256SUMS")
        r = self.verify()
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("SHA256SUMS is missing", r.stderr)


if __name__ == "__main__":
    sys.argv[1:1] = ["-v"]
    unittest.main()
