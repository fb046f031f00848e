#!/usr/bin/python3
"""FLUX.2-dev end to end: the real flux2_server serves tests/data/tiny-flux2-dev/checkpoint (CPU,
--max-sequence-length 64) and the Python client checks it against the diffusers goldens of
tests/data/README.md's `tiny-flux2-dev/`: case0 (text-to-image, guidance_scale 4.0 given) and case1
(two reference images) return image_u8 within the float32 bar; guidance_scale from the request is
used (2.5 gives another image, an absent one the default 4.0's bytes); a negative_prompt is refused
naming it; custom `sigmas` (sigmas_cases.json: diffusers given the same sigmas) over gRPC and over
HTTP (/v1/images/generations) return that golden's image_u8 within the float32 bar; so do
step caching's dev cases (tests/data/cache: cache-dit's DBCache) over both, with their cached
counts, and 8 steps with caching or a bad threshold is refused naming the field; a
repeated prompt is a prompt-cache hit on /metrics with identical PNG bytes;
GetModelInfo says dev, 50 steps, guidance 4.0, embedded guidance. A second server runs with
--text-encoder-offload --prompt-cache-bytes 0 --transformer-file (the checkpoint's transformer as
one Black Forest Labs file): the same golden, every request a miss. Start-up refusals exit 1 saying why: a missing
--transformer-file, and (with a CUDA device) a memory plan larger than the device.
Helpers (stubs, PNG decoding, the server handle) come from python_client_test.py.
Run: ctest --test-dir build -R server_python_dev --output-on-failure
"""
import argparse
import base64
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest
import urllib.error
import urllib.request

import python_client_test as common

DEV_DIR = None  # tests/data/tiny-flux2-dev


def scrape(port):
    """{(name, frozenset of label pairs): value} of a Prometheus text exposition."""
    samples = {}
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, value = line.rsplit(" ", 1)
        name, labels = series, frozenset()
        if "{" in series:
            name, rest = series.split("{", 1)
            pairs = [p for p in rest.rstrip("}").split(",") if p]
            labels = frozenset(tuple(p.split("=", 1)) for p in pairs)
        samples[(name, labels)] = float(value)
    return samples


def cache_count(port, result):
    return scrape(port)[("flux2_prompt_cache_requests_total", frozenset({("result", f'"{result}"')}))]


def golden_cases():
    with open(os.path.join(DEV_DIR, "pipeline_cases.json")) as f:
        return json.load(f)


class DevTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        common.load_stubs(common.STUB_DIR.name)
        cls.pb = common.pb
        checkpoint = os.path.join(DEV_DIR, "checkpoint")
        common_flags = ["--backend", "cpu", "--max-sequence-length", "64", "--model-dir", checkpoint]
        cls.tmp = tempfile.TemporaryDirectory()
        cls.addClassCleanup(cls.tmp.cleanup)
        # The checkpoint's transformer rewritten as one Black Forest Labs file (flux2-dev.safetensors
        # naming) by the tool tests/host/bfl_checkpoint_test.cc checks byte for byte.
        transformer_file = os.path.join(cls.tmp.name, "flux2-dev.safetensors")
        subprocess.run([common.ARGS.make_bfl_transformer, "--transformer", os.path.join(checkpoint, "transformer"),
                        "--out", transformer_file], check=True)
        # Stopped even when a later start-up fails (tearDownClass would not run then).
        cls.server = common.ServerHandle(common_flags)
        cls.addClassCleanup(cls.server.stop)
        cls.offload = common.ServerHandle(common_flags + ["--text-encoder-offload", "--prompt-cache-bytes", "0",
                                                          "--transformer-file", transformer_file])
        cls.addClassCleanup(cls.offload.stop)

    def reference(self, name):
        with open(os.path.join(DEV_DIR, name), "rb") as f:
            return self.pb.ReferenceImage(data=f.read())

    def golden_request(self, case, **changes):
        request = self.pb.GenerateImageRequest(prompt=case["prompt"], width=case["width"], height=case["height"],
                                               num_inference_steps=case["steps"], seed=case["seed"],
                                               guidance_scale=case["guidance_scale"],
                                               reference_images=[self.reference(n) for n in case["references"]])
        for field, value in changes.items():
            if value is None:
                request.ClearField(field)
            else:
                setattr(request, field, value)
        return request

    def generate(self, request, server=None):
        return (server or self.server).stub.GenerateImage(request, timeout=300)

    def golden_pixels(self, k, vectors="pipeline.safetensors"):
        shape, raw = common.read_safetensors(os.path.join(DEV_DIR, vectors), f"case{k}.image_u8")
        return common.nchw_to_hwc(shape, raw)  # [1, 3, H, W] -> H x W x 3

    def assert_golden(self, response, k, case, vectors="pipeline.safetensors"):
        self.assert_golden_png(response.images[0].data, k, case, vectors)

    def assert_golden_png(self, png, k, case, vectors="pipeline.safetensors"):
        width, height, pixels = common.decode_png_rgb(png)
        self.assertEqual((width, height), (case["width"], case["height"]))
        want = self.golden_pixels(k, vectors)
        self.assertEqual(len(pixels), len(want))
        off_by_one, worse = common.u8_mismatch(pixels, want)
        self.assertEqual(worse, 0, f"{worse} values differ by more than one level")
        self.assertLessEqual(off_by_one, common.MAX_OFF_BY_ONE_FRACTION * len(want),
                             f"{off_by_one} of {len(want)} values differ by one level")
        return pixels

    def test_model_info_says_dev(self):
        info = self.server.info
        self.assertEqual(info.variant, "dev")
        self.assertEqual(info.pipeline_class, "Flux2Pipeline")
        self.assertEqual(info.default_steps, 50)
        self.assertEqual(info.default_guidance, 4.0)
        self.assertFalse(info.uses_cfg)
        self.assertTrue(info.guidance_embedded)
        self.assertFalse(info.text_encoder_streamed)
        self.assertEqual(info.prompt_cache_bytes, 256 << 20)
        self.assertEqual(info.transformer_file, "")
        self.assertEqual(info.limits.max_sequence_length, 64)
        offload = self.offload.info
        self.assertTrue(offload.text_encoder_streamed)
        self.assertGreater(offload.text_encoder_host_bytes, info.text_encoder_host_bytes)
        self.assertEqual(offload.prompt_cache_bytes, 0)
        self.assertEqual(offload.transformer_file, "flux2-dev.safetensors")

    def test_text_to_image_golden(self):  # case0, guidance_scale 4.0 given explicitly
        case = golden_cases()[0]
        self.assertEqual((case["references"], case["max_sequence_length"]), ([], 64))
        response = self.generate(self.golden_request(case))
        self.assertEqual(len(response.timings.step_seconds), case["steps"])
        self.assert_golden(response, 0, case)

    def test_editing_golden(self):  # case1: two references, one center-cropped 72x100 -> 64x96
        case = golden_cases()[1]
        self.assertEqual(len(case["references"]), 2)
        response = self.generate(self.golden_request(case))
        self.assertGreater(response.timings.reference_encode_seconds, 0.0)
        self.assert_golden(response, 1, case)

    def test_custom_sigmas_golden_over_grpc_and_http(self):
        with open(os.path.join(DEV_DIR, "sigmas_cases.json")) as f:
            cases = json.load(f)
        for k, case in enumerate(cases):
            with self.subTest(case=k):
                request = self.golden_request(dict(case, references=[]), num_inference_steps=None)
                request.sigmas.extend(case["sigmas"])  # no steps given: one per sigma
                response = self.generate(request)
                self.assertEqual(len(response.timings.step_seconds), case["steps"])
                self.assert_golden(response, k, case, "sigmas.safetensors")
                body = {"prompt": case["prompt"], "size": f'{case["width"]}x{case["height"]}',
                        "seed": case["seed"], "guidance_scale": case["guidance_scale"],
                        "num_inference_steps": case["steps"], "sigmas": case["sigmas"],
                        "response_format": "b64_json", "output_format": "png"}
                http = urllib.request.Request(f"http://127.0.0.1:{self.server.http_port}/v1/images/generations",
                                              data=json.dumps(body).encode(),
                                              headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(http, timeout=300) as answer:
                    image = json.loads(answer.read())["data"][0]["b64_json"]
                self.assert_golden_png(base64.b64decode(image), k, case, "sigmas.safetensors")

    def post_generations(self, body):
        """The JSON answer of /v1/images/generations, or (status, error body) when refused."""
        http = urllib.request.Request(f"http://127.0.0.1:{self.server.http_port}/v1/images/generations",
                                      data=json.dumps(body).encode(),
                                      headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(http, timeout=300) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def test_step_cache_golden_over_grpc_and_http(self):
        """cache/'s dev cases (cache-dit's DBCache F1B0: R 0, R 1, a calibrated R) return their
        image_u8 within the float32 bar, with the forwards cached as cache-dit cached them."""
        with open(os.path.join(DEV_DIR, "..", "cache", "cache_cases.json")) as f:
            cases = json.load(f)["cases"]
        vectors = os.path.join("..", "cache", "cache.safetensors")
        for k, case in enumerate(cases):
            if case["pipeline"] != "dev":
                continue
            with self.subTest(case=k):
                cached = len(case["cached_steps"]["double.cond"])
                request = self.golden_request(dict(case, references=[]))
                request.cache.mode = self.pb.StepCache.MODE_DBCACHE
                request.cache.warmup_steps = case["W"]
                request.cache.max_consecutive_cached = case["MC"]
                request.cache.threshold = case["R"]
                response = self.generate(request)
                self.assertEqual(response.timings.cache.double_cached, cached)
                self.assertEqual(response.timings.cache.double_computed, case["steps"] - cached)
                self.assert_golden(response, k, case, vectors)
                body = {"prompt": case["prompt"], "size": f'{case["width"]}x{case["height"]}',
                        "seed": case["seed"], "guidance_scale": case["guidance_scale"],
                        "num_inference_steps": case["steps"], "response_format": "b64_json",
                        "output_format": "png",
                        "cache": {"mode": "dbcache", "warmup_steps": case["W"],
                                  "max_consecutive_cached": case["MC"], "threshold": case["R"]}}
                answer = self.post_generations(body)
                self.assertEqual(answer["timings"]["cache"]["single_cached"],
                                 len(case["cached_steps"]["single.cond"]))
                self.assert_golden_png(base64.b64decode(answer["data"][0]["b64_json"]), k, case, vectors)

    def test_step_cache_refused_for_eight_steps_naming_the_field(self):
        case = golden_cases()[0]
        request = self.golden_request(dict(case, references=[]), num_inference_steps=8)
        request.cache.mode = self.pb.StepCache.MODE_DBCACHE
        with self.assertRaises(common.grpc.RpcError) as raised:
            self.generate(request)
        self.assertEqual(raised.exception.code(), common.grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("cache: step caching needs more than 8 steps", raised.exception.details())
        status, error = self.post_generations({"prompt": "x", "size": "64x64", "num_inference_steps": 8,
                                               "cache": {"threshold": 0.3}})
        self.assertEqual(status, 400)
        self.assertEqual(error["error"]["param"], "cache")
        status, error = self.post_generations({"prompt": "x", "size": "64x64", "num_inference_steps": 12,
                                               "cache": {"threshold": 2}})
        self.assertEqual(status, 400)
        self.assertEqual(error["error"]["param"], "cache.threshold")
        self.assertIn("cache.threshold: 2 is not a finite value in 0..1", error["error"]["message"])

    def test_guidance_from_the_request_is_used(self):
        case = golden_cases()[0]
        given = self.generate(self.golden_request(case)).images[0].data
        other = self.generate(self.golden_request(case, guidance_scale=2.5)).images[0].data
        self.assertNotEqual(other, given)
        _, _, pixels = common.decode_png_rgb(other)
        _, worse = common.u8_mismatch(pixels, self.golden_pixels(0))
        self.assertGreater(worse, 0, "guidance 2.5 gave guidance 4.0's image")
        # Absent: the model default, 4.0, so the golden's bytes.
        default = self.generate(self.golden_request(case, guidance_scale=None)).images[0].data
        self.assertEqual(default, given)

    def test_negative_prompt_is_refused_naming_it(self):
        request = self.golden_request(golden_cases()[0], negative_prompt="blurry, low quality")
        with self.assertRaises(common.grpc.RpcError) as raised:
            self.generate(request)
        error = raised.exception
        self.assertEqual(error.code(), common.grpc.StatusCode.INVALID_ARGUMENT)
        self.assertTrue(error.details().startswith("negative_prompt: "), error.details())
        status = common.status_pb2.Status.FromString(dict(error.trailing_metadata())["grpc-status-details-bin"])
        bad_request = common.error_details_pb2.BadRequest()
        self.assertTrue(status.details[0].Unpack(bad_request))
        self.assertEqual([v.field for v in bad_request.field_violations], ["negative_prompt"])

    def test_repeated_prompt_is_a_prompt_cache_hit(self):
        port = self.server.metrics_port
        request = self.golden_request(golden_cases()[0], prompt="a lighthouse on a cliff, only in this test",
                                      width=48, height=32, num_inference_steps=2)
        hits, misses = cache_count(port, "hit"), cache_count(port, "miss")
        first = self.generate(request)
        self.assertEqual((cache_count(port, "hit"), cache_count(port, "miss")), (hits, misses + 1))
        second = self.generate(request)
        self.assertEqual((cache_count(port, "hit"), cache_count(port, "miss")), (hits + 1, misses + 1))
        self.assertEqual(second.images[0].data, first.images[0].data)
        self.assertEqual(scrape(port)[("flux2_prompt_cache_capacity_bytes", frozenset())], 256 << 20)

    def test_streamed_text_encoder_without_cache(self):
        case = golden_cases()[0]
        port = self.offload.metrics_port
        misses = cache_count(port, "miss")
        for _ in range(2):
            self.assert_golden(self.generate(self.golden_request(case), self.offload), 0, case)
        self.assertEqual(cache_count(port, "miss"), misses + 2)
        self.assertEqual(cache_count(port, "hit"), 0.0)
        self.assertEqual(scrape(port)[("flux2_prompt_cache_capacity_bytes", frozenset())], 0.0)


class StartUpRefusalTest(unittest.TestCase):
    """Models that cannot be served end the process with exit 1 and, last on stderr, why."""

    def serve(self, *flags):
        command = [common.ARGS.server, "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0", "--http-port", "0",
                   "--model-dir", os.path.join(DEV_DIR, "checkpoint")] + list(flags)
        return subprocess.run(command, capture_output=True, text=True, timeout=300)

    def test_missing_transformer_file_names_the_flag(self):
        run = self.serve("--backend", "cpu", "--transformer-file", "/nonexistent/flux2-dev.safetensors")
        self.assertEqual(run.returncode, 1, run.stderr)
        last = log_message(run.stderr.strip().splitlines()[-1], "ERROR")
        self.assertTrue(last.startswith("flux2_server: exiting: the model failed to load: NOT_FOUND: "
                                        "--transformer-file: "), last)
        self.assertIn("/nonexistent/flux2-dev.safetensors", last)

    def test_plan_larger_than_the_device_is_refused_at_start_up(self):
        """A plan that cannot fit (a 1 TiB prompt cache) is refused before any allocation, with the
        plan and the flag that shrinks it (--text-encoder-offload). Needs a CUDA device (the CPU
        has no separate device memory to check), else skipped."""
        run = self.serve("--backend", "cuda", "--prompt-cache-bytes", str(1 << 40))
        if "--backend cuda:" in run.stderr:
            self.skipTest("no usable CUDA device: " + run.stderr.strip().splitlines()[0])
        self.assertEqual(run.returncode, 1, run.stderr)
        self.assertIn("does not fit this device", run.stderr)
        self.assertIn("prompt cache 1099.51 GB", run.stderr)
        self.assertIn("--text-encoder-offload", run.stderr)
        last = log_message(run.stderr.strip().splitlines()[-1], "ERROR")
        self.assertTrue(last.startswith("flux2_server: exiting: the model failed to load: RESOURCE_EXHAUSTED"), last)


def log_message(line, level):
    """The message of a text-format log line "<RFC 3339 UTC time> <LEVEL> flux2_server: ..." (server/common/log.h),
    checking its timestamp and level."""
    match = re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (INFO|WARNING|ERROR) (.*)$", line)
    assert match, f"not a log line: {line!r}"
    assert match.group(1) == level, line
    return match.group(2)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--proto-dir", required=True)
    parser.add_argument("--make-bfl-transformer", required=True, help="the flux2_make_bfl_transformer tool")
    parser.add_argument("--data-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"),
                        help="tests/data (the goldens; default: beside this script)")
    common.ARGS, rest = parser.parse_known_args()
    common.STUB_DIR = tempfile.TemporaryDirectory()
    DEV_DIR = os.path.join(common.ARGS.data_dir, "tiny-flux2-dev")
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
