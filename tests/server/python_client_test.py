#!/usr/bin/python3
"""A client in another language: Python (Debian python3-grpcio + python3-protobuf) calls the real
flux2_server on the tiny checkpoint, with stubs generated at test time from proto/ by protoc and
grpc_python_plugin. Checks GetModelInfo, GenerateImage (PNG header, size, seed echo, timings),
GenerateImageStream, a BadRequest error and the SIGTERM exit code.
Run: ctest --test-dir build -R server_python_client --output-on-failure
"""
import argparse
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

ARGS = None


def generate_stubs(proto_dir, out_dir):
    # grpc/health/v1 is left out on purpose: a generated top-level "grpc" package would shadow grpcio.
    protos = ["flux2/v1/image_generation.proto", "google/rpc/status.proto", "google/rpc/error_details.proto"]
    subprocess.run(["protoc", "-I", proto_dir, "--python_out", out_dir, "--grpc_python_out", out_dir,
                    "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin"] + protos, check=True)


def png_size(data):
    """Width and height from a PNG's IHDR chunk (the first chunk after the 8-byte signature)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


class PythonClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        generate_stubs(ARGS.proto_dir, cls.tmp.name)
        sys.path.insert(0, cls.tmp.name)
        global grpc, pb, pb_grpc, status_pb2, error_details_pb2
        import grpc
        from flux2.v1 import image_generation_pb2 as pb
        from flux2.v1 import image_generation_pb2_grpc as pb_grpc
        from google.rpc import error_details_pb2, status_pb2
        cls.server = subprocess.Popen([ARGS.server, "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0"],
                                      stdout=subprocess.PIPE, text=True)
        port = None
        for line in cls.server.stdout:
            if line.startswith("flux2_server: listening grpc="):
                port = int(line.split("grpc=")[1].split()[0])
                break
        assert port, "the server did not report its port"
        cls.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        cls.stub = pb_grpc.ImageGenerationStub(cls.channel)
        # Ready once GetModelInfo stops answering UNAVAILABLE (model loaded and warmed up).
        deadline = time.monotonic() + 120
        while True:
            try:
                cls.info = cls.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
                break
            except grpc.RpcError as error:
                if error.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        if cls.server.poll() is None:
            cls.server.kill()
            cls.server.wait()
        cls.tmp.cleanup()

    def request(self, seed, **fields):
        values = dict(prompt="a lighthouse at dusk", width=64, height=48, num_inference_steps=2, seed=seed)
        values.update(fields)
        return pb.GenerateImageRequest(**values)

    def test_model_info(self):
        self.assertEqual(self.info.variant, "klein-distilled")
        self.assertEqual(self.info.limits.pixel_multiple, 16)
        self.assertIn(pb.QUALITY_LOSSLESS, self.info.quality_levels)
        self.assertIn(pb.OUTPUT_FORMAT_PNG, self.info.output_formats)

    def test_generate_image(self):
        response = self.stub.GenerateImage(self.request(7, request_id="py-1"), timeout=120)
        self.assertEqual(response.seed, 7)
        self.assertEqual(response.request_id, "py-1")
        self.assertEqual(len(response.images), 1)
        image = response.images[0]
        self.assertEqual(image.mime_type, "image/png")
        self.assertEqual(png_size(image.data), (64, 48))
        self.assertEqual(len(response.timings.step_seconds), 2)
        self.assertGreater(response.timings.denoise_seconds, 0.0)
        again = self.stub.GenerateImage(self.request(7), timeout=120)
        self.assertEqual(again.images[0].data, image.data)

    def test_stream(self):
        events = list(self.stub.GenerateImageStream(self.request(8), timeout=120))
        kinds = [event.WhichOneof("event") for event in events]
        self.assertEqual(kinds, ["progress", "progress", "result"])
        self.assertEqual([e.progress.step_index for e in events[:2]], [0, 1])
        self.assertEqual(events[-1].result.seed, 8)

    def test_invalid_argument_names_the_field(self):
        with self.assertRaises(grpc.RpcError) as raised:
            self.stub.GenerateImage(self.request(1, width=65), timeout=60)
        error = raised.exception
        self.assertEqual(error.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("width", error.details())
        details = dict(error.trailing_metadata()).get("grpc-status-details-bin")
        self.assertIsNotNone(details)
        status = status_pb2.Status.FromString(details)
        bad_request = error_details_pb2.BadRequest()
        self.assertTrue(status.details[0].Unpack(bad_request))
        self.assertEqual([v.field for v in bad_request.field_violations], ["width"])

    def test_zz_sigterm_exits_zero(self):  # runs last (alphabetical order)
        self.server.send_signal(signal.SIGTERM)
        self.assertEqual(self.server.wait(timeout=120), 0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--proto-dir", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
