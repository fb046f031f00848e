#!/usr/bin/python3
# The real flux2_server's /metrics (tiny checkpoint, CPU, --gpus 3: three ranks, so the several-GPU families are
# exported too; or a saved scrape in FLUX2_SCRAPE_FILE, e.g. from a CUDA server): `promtool check metrics` is clean,
# METRICS.md metrics exported, every metric the dashboard/rules/adapter query exists.
import os
import pathlib
import re
import subprocess
import sys
import unittest

import exposition
from deploy_common import METRICS_MD, RULES_FILE, all_exprs, metrics_contract, recording_rule_names, series_names, tool
from promql import metric_names, selectors
from server_fixture import Flux2Server

REQUEST = '{"prompt": "a red fox in the snow, watercolor", "width": 64, "height": 64, "num_inference_steps": 3, "seed": 100}'
BAD_REQUEST = '{"prompt": "width not a multiple of 16", "width": 65, "height": 64}'
# Series Prometheus itself adds to every scrape (not the server's to export).
PROMETHEUS_SERIES = {"up"}
# Labels Prometheus / prometheus-operator attach to every scraped series.
TARGET_LABELS = {"instance", "job", "namespace", "pod", "service", "endpoint", "container"}


def contract_buckets() -> tuple[list[float], list[float]]:
    """(request and stage buckets, step buckets, collective buckets) as METRICS.md states them."""
    text = METRICS_MD.read_text()
    groups = re.findall(r"`((?:\d+(?:\.\d+)? )+\d+(?:\.\d+)?)`", text[text.index("Histogram buckets"):])
    assert len(groups) == 3, f"{METRICS_MD}: expected three bucket lists, found {groups}"
    return tuple([float(b) for b in g.split()] for g in groups)


class MetricsContractTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # FLUX2_SCRAPE_FILE: check a scrape saved elsewhere (e.g. a CUDA-backend server on a GPU machine)
        # instead of starting the CPU server here.
        cls.server = None
        scrape_file = os.environ.get("FLUX2_SCRAPE_FILE")
        if scrape_file:
            cls.text = pathlib.Path(scrape_file).read_text()
        else:
            cls.server = Flux2Server("--gpus", "3").__enter__()  # the tiny checkpoint's 3 heads
            try:
                cls.ok_report = cls.server.loadgen(REQUEST, requests=2)
                cls.bad_report = cls.server.loadgen(BAD_REQUEST, requests=1)
                cls.text = cls.server.scrape()
            except BaseException:
                cls.server.__exit__(None, None, None)
                raise
        cls.families = exposition.parse(cls.text)
        cls.names = exposition.exported_names(cls.families)
        cls.contract = metrics_contract()
        build = cls.families["flux2_build_info"].samples
        cls.backend = build[0][1].get("backend") if build else None
        # Our own server splits requests over 3 ranks; a saved scrape may come from one GPU.
        cls.several_gpus = cls.server is not None

    @classmethod
    def tearDownClass(cls):
        if cls.server:
            cls.server.__exit__(None, None, None)

    def may_be_missing(self, family: str) -> bool:
        """A CUDA-only family may be absent from a CPU-backend scrape, a several-GPU family from a
        one-GPU server's (METRICS.md marks them so)."""
        c = self.contract[family]
        return (c["cuda_only"] and self.backend == "cpu") or (c["several_gpus_only"] and not self.several_gpus)

    def optional_missing(self, name: str) -> bool:
        """`name` is a series of a family that may be absent here (may_be_missing)."""
        fam = next((f for f, c in self.contract.items() if name in series_names(f, c["type"])), None)
        return fam is not None and self.may_be_missing(fam)

    def test_requests_ran(self):
        if self.server is None:
            self.skipTest("checking a saved scrape")
        self.assertEqual(self.ok_report["status"], {"OK": 2})
        self.assertEqual(self.ok_report["images"], 2)
        self.assertEqual(self.bad_report["status"], {"INVALID_ARGUMENT": 1})
        self.assertEqual(self.backend, "cpu")
        self.assertEqual(exposition.value(self.families, "flux2_ready"), 1)
        # --gpus 3: each rank's collective time per step, labelled by its device ordinal.
        collectives = self.families["flux2_denoise_step_collective_seconds"].samples
        self.assertEqual({labels["gpu"] for _, labels, *_ in collectives}, {"0", "1", "2"})

    def test_promtool_check_metrics_is_clean(self):
        r = subprocess.run([tool("promtool"), "check", "metrics"], input=self.text, capture_output=True, text=True)
        self.assertEqual((r.returncode, r.stdout.strip(), r.stderr.strip()), (0, "", ""),
                         "promtool check metrics found problems")

    def test_every_contract_metric_is_exported_with_its_type(self):
        for family, c in self.contract.items():
            with self.subTest(metric=family):
                if family not in self.families and self.may_be_missing(family):
                    print(f"note: {family} (CUDA or several GPUs only) is not in this scrape", file=sys.stderr)
                    continue
                self.assertIn(family, self.families, f"{family} is in METRICS.md but not in /metrics")
                self.assertEqual(self.families[family].type, c["type"])
                self.assertLessEqual(series_names(family, c["type"]), self.names)

    def test_every_queried_metric_is_exported(self):
        recorded = recording_rule_names()
        for where, expr in all_exprs():
            for name in metric_names(expr):
                with self.subTest(where=where, metric=name):
                    if ":" in name:
                        self.assertIn(name, recorded, "a recording-rule name that no rule records")
                    elif name in PROMETHEUS_SERIES:
                        continue
                    elif name not in self.names and self.optional_missing(name):
                        print(f"note: {where} queries {name} (CUDA or several GPUs only; absent here)",
                              file=sys.stderr)
                    else:
                        self.assertIn(name, self.names, f"{where}: {name} is not exported by flux2_server")

    def test_label_matchers_name_labels_of_their_metric(self):
        seen = exposition.label_names(self.families)
        for where, expr in all_exprs():
            for name, labels in selectors(expr):
                fam = next((f for f, c in self.contract.items() if name in series_names(f, c["type"])), None)
                allowed = set(TARGET_LABELS) | seen.get(name, set())
                if fam:
                    allowed |= self.contract[fam]["labels"]
                if name.endswith("_bucket"):
                    allowed.add("le")
                for label in labels:
                    with self.subTest(where=where, metric=name, label=label):
                        self.assertIn(label, allowed)

    def test_histogram_buckets(self):
        request_buckets, step_buckets, collective_buckets = contract_buckets()
        for family, want in (("flux2_request_duration_seconds", request_buckets),
                             ("flux2_stage_duration_seconds", request_buckets),
                             ("flux2_denoise_step_duration_seconds", step_buckets),
                             ("flux2_denoise_step_collective_seconds", collective_buckets)):
            if family not in self.families and self.may_be_missing(family):
                continue
            with self.subTest(metric=family):
                les = {s[1]["le"] for s in self.families[family].samples if s[0].endswith("_bucket")}
                self.assertEqual(sorted(float(le) for le in les), want + [float("inf")])
        # The p99 alert compares with a multiple of the mean denoising time (relative, for every model):
        # the recording rule it reads is over these request buckets.
        self.assertRegex(RULES_FILE.read_text(), r"p99_5m\s*> on\(\) group_left\(\)\s*5 \* \(sum\(rate\("
                                                 r"flux2_stage_duration_seconds_sum\{stage=\"denoise\"\}")


if __name__ == "__main__":
    sys.argv[1:1] = ["-v"]
    unittest.main()
