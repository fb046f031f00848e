#!/usr/bin/python3
# Load generator for flux2_server: N concurrent callers for a fixed duration; reports count, rps, latency percentiles, status codes.
# Tested by tests/deploy/test_loadgen_stats.py (statistics) and test_prometheus_e2e.py (drives a real server, counts cross-checked).
"""Usage examples:

  deploy/loadgen/flux2_loadgen.py --target 127.0.0.1:50051 --concurrency 4 --duration 60
  deploy/loadgen/flux2_loadgen.py --target dns:///flux2-server.default.svc:50051 -c 16 -d 300 \\
      --request '{"prompt": "a lighthouse at dusk", "width": 1024, "height": 1024}' --json-out run.json

Message types come from proto/flux2/v1/*.proto, compiled at run time with protoc into a descriptor
set (no generated stubs to keep in sync), or from --descriptor-set. Needs Debian's python3-grpcio,
python3-protobuf and protobuf-compiler. A dns:/// target with round_robin spreads requests over every pod behind the
headless Service.
"""
import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from loadgen_stats import Sample, build_report, format_report  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
SERVICE = "flux2.v1.ImageGeneration"
HEALTH_SERVICE = "grpc.health.v1.Health"
DEFAULT_REQUEST = {"prompt": "a red fox in the snow, watercolor", "width": 1024, "height": 1024, "seed": 42}


class Api:
    """Message classes of the flux2 and health protos, built from a protoc descriptor set."""

    def __init__(self, proto_dir: pathlib.Path, descriptor_set: str | None = None):
        if descriptor_set:
            fds = descriptor_pb2.FileDescriptorSet.FromString(pathlib.Path(descriptor_set).read_bytes())
        else:
            fds = self.compile(proto_dir)
        self.pool = descriptor_pool.DescriptorPool()
        for fdp in fds.file:
            self.pool.Add(fdp)
        self.service = self.pool.FindServiceByName(SERVICE)

    @staticmethod
    def compile(proto_dir: pathlib.Path):
        """flux2/v1/*.proto (+ the health proto) -> FileDescriptorSet, with protoc."""
        protoc = shutil.which("protoc")
        if protoc is None:
            raise SystemExit("flux2_loadgen: protoc not found (Debian package protobuf-compiler); "
                             "or pass --descriptor-set")
        files = sorted(str(p.relative_to(proto_dir)) for p in proto_dir.glob("flux2/v1/*.proto"))
        health = proto_dir / "grpc/health/v1/health.proto"
        if health.exists():
            files.append(str(health.relative_to(proto_dir)))
        if not files:
            raise SystemExit(f"flux2_loadgen: no flux2/v1/*.proto under {proto_dir}")
        with tempfile.TemporaryDirectory() as tmp:
            out = pathlib.Path(tmp) / "flux2.pb"
            subprocess.run([protoc, f"--proto_path={proto_dir}", "--include_imports",
                            f"--descriptor_set_out={out}", *files], check=True)
            return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())

    def message_class(self, descriptor):
        if hasattr(message_factory, "GetMessageClass"):  # protobuf >= 4.22
            return message_factory.GetMessageClass(descriptor)
        return message_factory.MessageFactory(self.pool).GetPrototype(descriptor)

    def method(self, name: str):
        """(descriptor, request class, response class) of an ImageGeneration method."""
        m = self.service.methods_by_name.get(name)
        if m is None:
            raise SystemExit(f"flux2_loadgen: {SERVICE} has no method {name!r} "
                             f"(has {', '.join(self.service.methods_by_name)})")
        return m, self.message_class(m.input_type), self.message_class(m.output_type)


def make_channel(args) -> grpc.Channel:
    options = [("grpc.max_receive_message_length", 256 * 1024 * 1024),
               ("grpc.lb_policy_name", "round_robin")]
    if args.tls_ca:
        creds = grpc.ssl_channel_credentials(root_certificates=pathlib.Path(args.tls_ca).read_bytes())
        return grpc.secure_channel(args.target, creds, options=options)
    return grpc.insecure_channel(args.target, options=options)


def wait_ready(api: Api, channel: grpc.Channel, timeout_s: float) -> None:
    """Polls grpc.health.v1 Check("readiness") until SERVING or the timeout."""
    try:
        svc = api.pool.FindServiceByName(HEALTH_SERVICE)
    except KeyError:
        raise SystemExit("flux2_loadgen: --wait-ready needs proto/grpc/health/v1/health.proto")
    check = svc.methods_by_name["Check"]
    req_cls, resp_cls = api.message_class(check.input_type), api.message_class(check.output_type)
    call = channel.unary_unary(f"/{HEALTH_SERVICE}/Check", request_serializer=req_cls.SerializeToString,
                               response_deserializer=resp_cls.FromString)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            status = call(req_cls(service="readiness"), timeout=2.0).status
            if resp_cls.DESCRIPTOR.fields_by_name["status"].enum_type.values_by_number[status].name == "SERVING":
                return
        except grpc.RpcError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"flux2_loadgen: {timeout_s:.0f} s passed and readiness is not SERVING")
        time.sleep(0.5)


def run(args) -> dict:
    api = Api(pathlib.Path(args.proto_dir), args.descriptor_set)
    method, req_cls, resp_cls = api.method(args.method)
    try:
        request = json_format.ParseDict(json.loads(args.request), req_cls())
    except (json.JSONDecodeError, json_format.ParseError) as e:
        raise SystemExit(f"flux2_loadgen: --request is not a valid {req_cls.DESCRIPTOR.full_name}: {e}")
    metadata = []
    if args.token_file:
        metadata.append(("authorization", "Bearer " + pathlib.Path(args.token_file).read_text().strip()))
    channel = make_channel(args)
    if args.wait_ready > 0:
        wait_ready(api, channel, args.wait_ready)
    path = f"/{SERVICE}/{method.name}"
    if method.server_streaming:
        call = channel.unary_stream(path, request_serializer=req_cls.SerializeToString,
                                    response_deserializer=resp_cls.FromString)
    else:
        call = channel.unary_unary(path, request_serializer=req_cls.SerializeToString,
                                   response_deserializer=resp_cls.FromString)

    samples: list[Sample] = []
    lock = threading.Lock()
    issued = 0
    start = time.monotonic()
    stop_at = start + args.duration

    def take_ticket() -> bool:
        nonlocal issued
        with lock:
            if time.monotonic() >= stop_at or (args.requests and issued >= args.requests):
                return False
            issued += 1
            return True

    def worker() -> None:
        while take_ticket():
            t0 = time.perf_counter()
            images, code = 0, "OK"
            try:
                if method.server_streaming:
                    for event in call(request, timeout=args.timeout, metadata=metadata):
                        # One `image` event per image (with its bytes); `result` describes them.
                        if event.WhichOneof("event") == "image":
                            images += 1
                else:
                    images = len(call(request, timeout=args.timeout, metadata=metadata).images)
            except grpc.RpcError as e:
                code = e.code().name
                if args.verbose:
                    print(f"flux2_loadgen: {code}: {e.details()}", file=sys.stderr)
            sample = Sample(time.perf_counter() - t0, code, images)
            with lock:
                samples.append(sample)
            if code in ("RESOURCE_EXHAUSTED", "UNAVAILABLE") and args.reject_pause > 0:
                time.sleep(args.reject_pause)  # a full queue answers at once: do not spin on it

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    channel.close()
    return build_report(samples, elapsed, target=args.target, method=method.name,
                        concurrency=args.concurrency)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="127.0.0.1:50051", help="host:port or dns:///name:port")
    p.add_argument("-c", "--concurrency", type=int, default=1, help="concurrent callers (default 1)")
    p.add_argument("-d", "--duration", type=float, default=30.0,
                   help="seconds to keep issuing requests; started requests finish (default 30)")
    p.add_argument("-n", "--requests", type=int, default=0,
                   help="stop after issuing this many requests (default: no count limit)")
    p.add_argument("--method", default="GenerateImage", help="GenerateImage or GenerateImageStream")
    p.add_argument("--request", default=json.dumps(DEFAULT_REQUEST),
                   help="GenerateImageRequest as proto3 JSON (field names as in the .proto)")
    p.add_argument("--timeout", type=float, default=600.0, help="per-request deadline in seconds")
    p.add_argument("--reject-pause", type=float, default=0.1,
                   help="seconds a caller waits after RESOURCE_EXHAUSTED/UNAVAILABLE (default 0.1; 0: none)")
    p.add_argument("--token-file", help="bearer token file (server --auth-token-file)")
    p.add_argument("--tls-ca", help="PEM root certificate: use TLS")
    p.add_argument("--wait-ready", type=float, default=0.0,
                   help="first wait up to this many seconds for readiness SERVING")
    p.add_argument("--proto-dir", default=str(REPO / "proto"), help="root of the .proto files")
    p.add_argument("--descriptor-set", help="use this FileDescriptorSet (protoc --include_imports "
                   "--descriptor_set_out) instead of compiling --proto-dir; for machines without protoc")
    p.add_argument("--json-out", help="also write the report as JSON to this file")
    p.add_argument("-v", "--verbose", action="store_true", help="print every failed request")
    args = p.parse_args(argv)
    if args.concurrency < 1 or args.duration <= 0 or args.requests < 0 or args.reject_pause < 0:
        p.error("--concurrency must be >= 1, --duration > 0, --requests >= 0 and --reject-pause >= 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    report = run(args)
    print(format_report(report))
    if args.json_out:
        pathlib.Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["count"] else 1


if __name__ == "__main__":
    sys.exit(main())
