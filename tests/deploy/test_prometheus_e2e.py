#!/usr/bin/python3
# A real Prometheus (Debian's binary, loopback, 1 s scrapes, flux2-rules.yaml loaded) scraping a real flux2_server:
# after the load generator's requests, Prometheus' HTTP API reports exactly the expected counter and histogram values.
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse
import urllib.request
from datetime import datetime

from deploy_common import RULES_FILE, dashboard_exprs, rules, tool
from promql import grafana_to_promql, metric_names
from server_fixture import Flux2Server, free_port

WIDTH, HEIGHT, STEPS = 64, 64, 3
REQUEST = json.dumps({"prompt": "a red fox in the snow, watercolor", "width": WIDTH, "height": HEIGHT,
                      "num_inference_steps": STEPS, "seed": 100})
BAD_REQUEST = json.dumps({"prompt": "width not a multiple of 16", "width": 65, "height": 64})
N_OK = 3
# Instant queries whose value must grow by exactly the given amount over the run.
EXPECTED_INCREASE = {
    'sum(flux2_requests_total{method="GenerateImage",code="OK"})': N_OK,
    'sum(flux2_requests_total{method="GenerateImage",code="INVALID_ARGUMENT"})': 1,
    'sum(flux2_request_duration_seconds_count{method="GenerateImage"})': N_OK + 1,
    "sum(flux2_denoise_step_duration_seconds_count)": N_OK * STEPS,
    'sum(flux2_denoise_step_duration_seconds_bucket{le="+Inf"})': N_OK * STEPS,
    'sum(flux2_stage_duration_seconds_count{stage="denoise"})': N_OK,
    "sum(flux2_queue_duration_seconds_count)": N_OK,
    "sum(flux2_images_generated_total)": N_OK,
    "sum(flux2_pixels_generated_total)": N_OK * WIDTH * HEIGHT,
}
# Seconds recorded over the run; each must fit inside the next.
TIME_SUMS = {
    "steps": "sum(flux2_denoise_step_duration_seconds_sum)",
    "denoise": 'sum(flux2_stage_duration_seconds_sum{stage="denoise"})',
    "rpc": 'sum(flux2_request_duration_seconds_sum{method="GenerateImage"})',
}
# Panels whose metrics only a CUDA backend produces, or that need a fast path to run: may be empty here.
MAY_BE_EMPTY_ON_CPU = {"flux2_gpu_memory_used_bytes", "flux2_gpu_memory_peak_bytes", "flux2_gpu_memory_total_bytes",
                       "flux2_fast_path_fallbacks_total", "flux2_fast_path_invocations_total",
                       # NVML (CUDA backend only)
                       "flux2_gpu_utilization_ratio", "flux2_gpu_memory_busy_ratio", "flux2_gpu_power_watts",
                       "flux2_gpu_sm_clock_hertz",
                       # a request split over several GPUs only (this server runs --gpus 1)
                       "flux2_denoise_step_collective_seconds_sum",
                       "flux2_denoise_step_collective_seconds_count"}
DEADLINE_S = 90


class Prometheus:
    """Debian's prometheus on a free loopback port with a temporary config and TSDB."""

    def __init__(self, target: str):
        self.tmp = tempfile.TemporaryDirectory()
        self.port = free_port()
        cfg = pathlib.Path(self.tmp.name) / "prometheus.yml"
        cfg.write_text(json.dumps({  # JSON is YAML
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
            "rule_files": [str(RULES_FILE)],
            "scrape_configs": [{"job_name": "flux2-server", "static_configs": [{"targets": [target]}]}],
        }))
        self.proc = subprocess.Popen(
            [tool("prometheus"), f"--config.file={cfg}", f"--storage.tsdb.path={self.tmp.name}/data",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=open(pathlib.Path(self.tmp.name) / "log", "w"))

    def log(self) -> str:
        return (pathlib.Path(self.tmp.name) / "log").read_text(errors="replace")

    def api(self, path: str, **params) -> dict:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list:
        return self.api("query", query=expr)["result"]

    def scalar(self, expr: str) -> float:
        """Value of a one-series instant query; 0 when the query is empty (a series not created yet)."""
        result = self.query(expr)
        assert len(result) <= 1, f"{expr}: {result}"
        return float(result[0]["value"][1]) if result else 0.0

    def wait(self, what: str, condition, timeout_s: float = DEADLINE_S):
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if condition():
                    return
            except (OSError, AssertionError):
                pass
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited with {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"after {timeout_s} s: {what}\n{self.log()}")
            time.sleep(0.5)

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.tmp.cleanup()


class PrometheusEndToEndTest(unittest.TestCase):
    def test_prometheus_sees_the_requests(self):
        with Flux2Server() as server:
            prom = Prometheus(f"127.0.0.1:{server.metrics_port}")
            self.addCleanup(prom.close)
            prom.wait("target flux2-server up", lambda: prom.scalar('up{job="flux2-server"}') == 1)
            baseline = {q: prom.scalar(q) for q in [*EXPECTED_INCREASE, *TIME_SUMS.values()]}

            ok = server.loadgen(REQUEST, requests=N_OK)
            bad = server.loadgen(BAD_REQUEST, requests=1)
            self.assertEqual(ok["status"], {"OK": N_OK})
            self.assertEqual(ok["images"], N_OK)
            self.assertEqual(bad["status"], {"INVALID_ARGUMENT": 1})

            def increases():
                return {q: prom.scalar(q) - baseline[q] for q in EXPECTED_INCREASE}
            prom.wait("counters reach the expected values", lambda: increases() == EXPECTED_INCREASE)
            self.assertEqual(increases(), EXPECTED_INCREASE)

            # Time is nested: every step is inside the denoise stage, every stage inside the RPC, and the
            # RPC inside the client's measured latency (the same machine's monotonic clocks; 1 ms slack for
            # the granularity of the two measurements).
            # (Differences from the baseline: the warm-up generation may have been recorded before it.)
            step_sum, denoise_sum, rpc_sum = (prom.scalar(q) - baseline[q] for q in TIME_SUMS.values())
            client_sum = ok["latency_s"]["mean"] * ok["count"] + bad["latency_s"]["mean"] * bad["count"]
            self.assertGreater(step_sum, 0)
            self.assertLessEqual(step_sum, denoise_sum + 1e-6)
            self.assertLessEqual(denoise_sum, rpc_sum + 1e-6)
            self.assertLessEqual(rpc_sum, client_sum + 1e-3)

            self.check_dashboard_queries(prom)
            self.check_rules(prom)

            # Stop the server: the scrape fails and the alerts for a dead fleet go pending.
            self.assertEqual(server.stop(), 0, "flux2_server must exit 0 on SIGTERM")
            prom.wait("Flux2ScrapeFailing and Flux2NoReadyReplicas pending",
                      lambda: {"Flux2ScrapeFailing", "Flux2NoReadyReplicas"} <= {
                          a["metric"]["alertname"] for a in prom.query('ALERTS{alertstate="pending"}')})

    def check_dashboard_queries(self, prom: Prometheus):
        # Every dashboard query evaluates without error; those over metrics the CPU backend produces are
        # non-empty after the traffic above.
        for title, expr in dashboard_exprs():
            query = grafana_to_promql(expr, "15s", {"namespace": ".*", "job": ".*", "instance": ".*"})
            with self.subTest(panel=title, expr=query):
                result = prom.query(query)
                if not metric_names(expr) & MAY_BE_EMPTY_ON_CPU:
                    self.assertTrue(result, "empty result")

    def check_rules(self, prom: Prometheus):
        # Wait for a few evaluations after the traffic, then: every rule loaded and evaluates cleanly, and a
        # healthy server triggers no alert.
        start = time.time()
        prom.wait("two rule evaluations after the traffic", lambda: all(
            g["lastEvaluation"] and _ts(g["lastEvaluation"]) > start + 1
            for g in prom.api("rules")["groups"]))
        groups = prom.api("rules")["groups"]
        loaded = {r["name"] for g in groups for r in g["rules"]}
        self.assertEqual(loaded, {r.get("alert") or r.get("record") for r in rules()})
        for g in groups:
            for r in g["rules"]:
                with self.subTest(rule=r["name"]):
                    self.assertEqual(r["health"], "ok", r.get("lastError"))
        self.assertEqual(prom.query("ALERTS"), [], "a healthy, idle server raised alerts")


def _ts(rfc3339: str) -> float:
    """Seconds since the epoch of a Go RFC 3339 time (nanosecond fraction, Z or +hh:mm)."""
    m = re.fullmatch(r"(.*T\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", rfc3339)
    assert m, rfc3339
    frac = (m.group(2) or ".0")[:7]
    tz = "+00:00" if m.group(3) == "Z" else m.group(3)
    return datetime.fromisoformat(m.group(1) + frac + tz).timestamp()


if __name__ == "__main__":
    sys.argv[1:1] = ["-v"]
    unittest.main()
