#!/usr/bin/python3
"""A client in another language: Python (Debian python3-grpcio + python3-protobuf) calls the real
flux2_server on the tiny checkpoint, with stubs generated at test time from proto/ by protoc and
grpc_python_plugin. Checks GetModelInfo, GenerateImage (PNG header, size, seed echo, timings),
GenerateImageStream, a BadRequest error and the SIGTERM exit code; and editing (EditingTest): the
golden editing generations of tests/data/tiny-klein (edit_cases.json, edit_kv_cases.json: the
reference PNGs, prompt, seed, steps and size, with and without the size given; the base case on a
copy of the checkpoint marked is_distilled false, klein-KV on one marked Flux2KleinKVPipeline)
must return image_u8 (tests/data/README.md) within the float32 bar, as must the LoRA generations of
lora_cases.json (adapters from a --lora-dir, echoed in the response), and every bad reference gets
INVALID_ARGUMENT naming it, after which the next request succeeds.
Run: ctest --test-dir build -R server_python_client --output-on-failure
"""
import argparse
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest
import zlib

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


def png_chunks(data):
    """(type, payload) of every chunk after the signature."""
    at = 8
    while at < len(data):
        (length,) = struct.unpack(">I", data[at:at + 4])
        yield data[at + 4:at + 8], data[at + 8:at + 8 + length]
        at += 12 + length


def decode_png_rgb(data):
    """(width, height, bytes H x W x 3) of an 8-bit RGB, non-interlaced PNG (what the server sends),
    undoing the five scanline filters of the PNG specification."""
    width, height = png_size(data)
    header = dict(png_chunks(data))[b"IHDR"]
    depth, color, _, _, interlace = struct.unpack(">BBBBB", header[8:13])
    assert (depth, color, interlace) == (8, 2, 0), f"not 8-bit RGB: depth {depth} color {color}"
    raw = zlib.decompress(b"".join(payload for kind, payload in png_chunks(data) if kind == b"IDAT"))
    line, bpp = width * 3, 3
    out = bytearray()
    previous = bytearray(line)
    for y in range(height):
        kind, row = raw[y * (line + 1)], bytearray(raw[y * (line + 1) + 1:(y + 1) * (line + 1)])
        for i in range(line):
            a = row[i - bpp] if i >= bpp else 0
            b = previous[i]
            c = previous[i - bpp] if i >= bpp else 0
            if kind == 1:
                row[i] = (row[i] + a) & 0xFF
            elif kind == 2:
                row[i] = (row[i] + b) & 0xFF
            elif kind == 3:
                row[i] = (row[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                row[i] = (row[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
            else:
                assert kind == 0, f"unknown PNG filter {kind}"
        out += row
        previous = row
    return width, height, bytes(out)


def encode_png_rgb(width, height, pixel):
    """An 8-bit RGB PNG whose pixel (x, y) is pixel(x, y) -> (r, g, b) (filter 0 on every row)."""
    rows = b"".join(b"\x00" + bytes(v for x in range(width) for v in pixel(x, y)) for y in range(height))

    def chunk(kind, payload):
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def read_safetensors(path, name):
    """(shape, raw bytes) of one tensor: an 8-byte little-endian header length, the JSON header,
    then the data (offsets relative to its start)."""
    with open(path, "rb") as f:
        data = f.read()
    (length,) = struct.unpack("<Q", data[:8])
    entry = json.loads(data[8:8 + length])[name]
    begin, end = entry["data_offsets"]
    return entry["shape"], data[8 + length + begin:8 + length + end]


def nchw_to_hwc(shape, raw):
    """[1, 3, H, W] bytes -> H x W x 3 bytes (the layout of decode_png_rgb)."""
    _, channels, height, width = shape
    plane = height * width
    return bytes(raw[c * plane + i] for i in range(plane) for c in range(channels))


def u8_mismatch(got, want):
    """(values off by one, values off by more) between two equal-length byte strings."""
    off_by_one = worse = 0
    for g, w in zip(got, want):
        d = abs(g - w)
        off_by_one += d == 1
        worse += d > 1
    return off_by_one, worse


# tests/data/README.md's float32 bar for image_u8: equal except at most 1 level on at most 0.5% of values.
MAX_OFF_BY_ONE_FRACTION = 0.005


def load_stubs(tmp_dir):
    """Generates the stubs once per process and imports them into this module's globals."""
    global grpc, pb, pb_grpc, status_pb2, error_details_pb2
    if "pb" in globals():
        return
    generate_stubs(ARGS.proto_dir, tmp_dir)
    sys.path.insert(0, tmp_dir)
    import grpc
    from flux2.v1 import image_generation_pb2 as pb
    from flux2.v1 import image_generation_pb2_grpc as pb_grpc
    from google.rpc import error_details_pb2, status_pb2


class ServerHandle:
    """A flux2_server process on free ports, with a channel and a stub once it serves."""

    def __init__(self, extra_args):
        self.process = subprocess.Popen([ARGS.server, "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0", "--http-port", "0"] +
                                        extra_args, stdout=subprocess.PIPE, text=True)
        port = None
        for line in self.process.stdout:
            if line.startswith("flux2_server: listening grpc="):
                port = int(line.split("grpc=")[1].split()[0])
                self.metrics_port = int(line.split("metrics=")[1].split()[0])
                self.http_port = int(line.split("http=")[1].split()[0])
                break
        assert port, "the server did not report its port"
        # References reach 10 MiB: the client's send limit is unlimited by default, its receive limit
        # is raised for the responses as proto/ recommends.
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}",
                                             options=[("grpc.max_receive_message_length", 64 << 20)])
        self.stub = pb_grpc.ImageGenerationStub(self.channel)
        deadline = time.monotonic() + 120
        while True:
            try:
                self.info = self.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
                break
            except grpc.RpcError as error:
                if error.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    self.stop()  # a server that failed to load must not outlive the test
                    raise
                time.sleep(0.05)

    def stop(self):
        self.channel.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def checkpoint_copy(source, target, **index_changes):
    """`target`: symlinks to `source`'s components and its model_index.json with `index_changes`
    (the same weights served as another pipeline variant)."""
    os.makedirs(target)
    for name in os.listdir(source):
        if name != "model_index.json":
            os.symlink(os.path.join(source, name), os.path.join(target, name))
    with open(os.path.join(source, "model_index.json")) as f:
        index = json.load(f)
    index.update(index_changes)
    with open(os.path.join(target, "model_index.json"), "w") as f:
        json.dump(index, f)
    return target


class PythonClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        load_stubs(STUB_DIR.name)
        cls.server = subprocess.Popen([ARGS.server, "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0", "--http-port", "0"],
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

    def request(self, seed, **fields):
        values = dict(prompt="a lighthouse at dusk", width=64, height=48, num_inference_steps=2, seed=seed)
        values.update(fields)
        return pb.GenerateImageRequest(**values)

    def test_model_info(self):
        self.assertEqual(self.info.variant, "klein-distilled")
        # tests/data/tiny-klein/checkpoint is named by its parent, as the proto says.
        self.assertEqual(self.info.model_name, "tiny-klein")
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
        self.assertEqual(kinds, ["progress", "progress", "image", "result"])
        self.assertEqual([e.progress.step_index for e in events[:2]], [0, 1])
        self.assertEqual(events[-1].result.seed, 8)
        # The image event carries the bytes; the result only describes them.
        self.assertEqual(png_size(events[2].image.data), (64, 48))
        self.assertEqual(events[2].image.seed, 8)
        self.assertEqual(events[-1].result.images[0].data, b"")
        self.assertEqual(events[-1].result.images[0].seed, 8)

    def test_unary_over_the_response_limit_is_refused_naming_num_images(self):
        # Three 768 x 768 PNGs may reach 3 x 1.77 MB, over the default --max-response-bytes (4 MiB).
        self.assertEqual(self.info.limits.max_response_bytes, 4 << 20)
        with self.assertRaises(grpc.RpcError) as raised:
            self.stub.GenerateImage(self.request(1, width=768, height=768, num_images=3), timeout=60)
        error = raised.exception
        self.assertEqual(error.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("num_images", error.details())
        self.assertIn("GenerateImageStream", error.details())

    def test_health_answers_the_service_name(self):
        # grpc.health.v1.Health/Check by hand: HealthCheckRequest.service is field 1 and
        # HealthCheckResponse.status field 1 (SERVING = 1); no stubs for grpc.* (see generate_stubs).
        check = self.channel.unary_unary("/grpc.health.v1.Health/Check")
        name = b"flux2.v1.ImageGeneration"
        self.assertEqual(check(b"\x0a" + bytes([len(name)]) + name, timeout=10), b"\x08\x01")

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


class EditingTest(unittest.TestCase):
    """Reference images end to end on the tiny checkpoint, against the diffusers goldens."""

    @classmethod
    def setUpClass(cls):
        load_stubs(STUB_DIR.name)
        cls.data = os.path.join(ARGS.data_dir, "tiny-klein")
        cls.tmp = tempfile.TemporaryDirectory()
        checkpoint = os.path.join(cls.data, "checkpoint")
        # --max-sequence-length 64: the goldens' text length.
        common = ["--backend", "cpu", "--max-sequence-length", "64"]
        cls.servers = {}
        cls.servers["distilled"] = ServerHandle(common + ["--model-dir", checkpoint])
        cls.servers["base"] = ServerHandle(common + ["--model-dir", checkpoint_copy(
            checkpoint, os.path.join(cls.tmp.name, "base"), is_distilled=False)])
        cls.servers["kv"] = ServerHandle(common + ["--model-dir", checkpoint_copy(
            checkpoint, os.path.join(cls.tmp.name, "kv"), _class_name="Flux2KleinKVPipeline")])
        # LoRA adapters: lora_cases.json's adapters as <name>.safetensors under --lora-dir.
        lora_dir = os.path.join(cls.tmp.name, "loras")
        os.mkdir(lora_dir)
        with open(os.path.join(cls.data, "lora_cases.json")) as f:
            for name, adapter in json.load(f)["adapters"].items():
                shutil.copy(os.path.join(cls.data, adapter["file"]),
                            os.path.join(lora_dir, name + ".safetensors"))
        cls.servers["lora"] = ServerHandle(common + ["--model-dir", checkpoint, "--lora-dir", lora_dir])

    @classmethod
    def tearDownClass(cls):
        for server in cls.servers.values():
            server.stop()
        cls.tmp.cleanup()

    def reference(self, name):
        with open(os.path.join(self.data, name), "rb") as f:
            return pb.ReferenceImage(data=f.read())

    def golden_request(self, case):
        request = pb.GenerateImageRequest(prompt=case["prompt"], seed=case["seed"],
                                          num_inference_steps=case["steps"],
                                          reference_images=[self.reference(name) for name in case["references"]])
        if case["size_given"]:
            request.width, request.height = case["width"], case["height"]
        if not case.get("is_distilled", True):
            request.guidance_scale = case["guidance_scale"]
        for name, scale in case.get("adapters", []):
            request.loras.add(name=name, scale=scale)
        return request

    def check_golden(self, cases_file, tensors_file, server_of, cases_key=None):
        with open(os.path.join(self.data, cases_file)) as f:
            cases = json.load(f)
        if cases_key is not None:
            cases = cases[cases_key]
        for k, case in enumerate(cases):
            with self.subTest(file=cases_file, case=k, size_given=case["size_given"]):
                self.assertEqual(case["max_sequence_length"], 64)
                server = self.servers[server_of(case)]
                response = server.stub.GenerateImage(self.golden_request(case), timeout=300)
                width, height, pixels = decode_png_rgb(response.images[0].data)
                self.assertEqual((width, height), (case["width"], case["height"]))
                if case["references"]:
                    self.assertGreater(response.timings.reference_encode_seconds, 0.0)
                self.assertEqual([(a.name, a.scale) for a in response.loras],
                                 [tuple(a) for a in case.get("adapters", [])])
                shape, raw = read_safetensors(os.path.join(self.data, tensors_file), f"case{k}.image_u8")
                want = nchw_to_hwc(shape, raw)
                self.assertEqual(len(pixels), len(want))
                off_by_one, worse = u8_mismatch(pixels, want)
                self.assertEqual(worse, 0, f"{worse} values differ by more than one level")
                self.assertLessEqual(off_by_one, MAX_OFF_BY_ONE_FRACTION * len(want),
                                     f"{off_by_one} of {len(want)} values differ by one level")

    def test_model_info_reports_the_editing_limits(self):
        info = self.servers["distilled"].info
        self.assertEqual(info.limits.max_reference_images, 4)
        self.assertEqual(info.limits.max_reference_bytes, 10 << 20)
        self.assertEqual(info.limits.max_request_bytes, 48 << 20)
        self.assertEqual(info.limits.max_sequence_length, 64)
        self.assertEqual(self.servers["base"].info.variant, "klein-base")
        self.assertEqual(self.servers["kv"].info.variant, "klein-kv")

    def test_edit_goldens(self):  # case 0: distilled, size from the reference; case 1: base, CFG
        self.check_golden("edit_cases.json", "edit.safetensors",
                          lambda case: "distilled" if case["is_distilled"] else "base")

    def test_edit_kv_goldens(self):
        self.check_golden("edit_kv_cases.json", "edit_kv.safetensors", lambda case: "kv")

    def test_lora_goldens(self):  # case 0: text-to-image, two adapters; case 1: editing, kohya
        self.check_golden("lora_cases.json", "lora_pipeline.safetensors", lambda case: "lora",
                          cases_key="pipeline_cases")

    def test_stream_with_references(self):
        with open(os.path.join(self.data, "edit_cases.json")) as f:
            case = json.load(f)[0]
        stub = self.servers["distilled"].stub
        events = list(stub.GenerateImageStream(self.golden_request(case), timeout=300))
        self.assertEqual([e.WhichOneof("event") for e in events],
                         ["progress"] * case["steps"] + ["image", "result"])
        unary = stub.GenerateImage(self.golden_request(case), timeout=300)
        self.assertEqual(events[-2].image.data, unary.images[0].data)

    def test_each_bad_reference_is_refused_naming_it(self):
        stub = self.servers["distilled"].stub
        good = self.reference("references/ref0_64x64.png")
        gray = lambda x, y: (128, 128, 128)
        cases = [
            ([good, pb.ReferenceImage(data=b"GIF89a")], "reference_images[1]", "not a PNG or JPEG image"),
            ([pb.ReferenceImage(data=encode_png_rgb(32, 32, gray))], "reference_images[0]",
             "32x32 is under 64 px a side"),
            ([pb.ReferenceImage(data=encode_png_rgb(768, 64, gray))], "reference_images[0]",
             "aspect ratio 12.0 exceeds 8"),
            ([pb.ReferenceImage(data=b"")], "reference_images[0]", "empty"),
            ([good] * 5, "reference_images", "5 reference images exceed the limit of 4"),
            ([good, good, pb.ReferenceImage(data=b"x" * 12000000)], "reference_images[2]",
             "12000000 bytes exceed the limit of 10485760"),
        ]
        for references, field, description in cases:
            with self.subTest(field=field, description=description):
                request = pb.GenerateImageRequest(prompt="make it night", num_inference_steps=1, seed=1,
                                                  reference_images=references)
                with self.assertRaises(grpc.RpcError) as raised:
                    stub.GenerateImage(request, timeout=60)
                error = raised.exception
                self.assertEqual(error.code(), grpc.StatusCode.INVALID_ARGUMENT)
                self.assertEqual(error.details(), f"{field}: {description}")
                status = status_pb2.Status.FromString(dict(error.trailing_metadata())["grpc-status-details-bin"])
                bad_request = error_details_pb2.BadRequest()
                self.assertTrue(status.details[0].Unpack(bad_request))
                self.assertEqual([(v.field, v.description) for v in bad_request.field_violations],
                                 [(field, description)])
                # The server keeps serving: the next request succeeds.
                ok = stub.GenerateImage(pb.GenerateImageRequest(prompt="make it night", num_inference_steps=1,
                                                                seed=2, reference_images=[good]), timeout=120)
                self.assertEqual(png_size(ok.images[0].data), (64, 64))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--proto-dir", required=True)
    parser.add_argument("--data-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"),
                        help="tests/data (the goldens; default: beside this script)")
    ARGS, rest = parser.parse_known_args()
    STUB_DIR = tempfile.TemporaryDirectory()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
