#!/usr/bin/python3
# Grafana dashboard deploy/grafana/flux2-dashboard.json: parses, is what render_dashboard.py produces, has
# unique ids and a sane grid, uses its variables, and has every required panel (latency percentiles,
# step latency, stages, throughput, queue, GPU memory and utilisation, fallbacks, errors, success).
import json
import subprocess
import sys
import unittest

from deploy_common import DASHBOARD_FILE, DEPLOY, PYTHON, dashboard
from promql import metric_names


class DashboardTest(unittest.TestCase):
    def setUp(self):
        self.d = json.loads(DASHBOARD_FILE.read_text())  # must parse
        self.panels = [p for p in self.d["panels"] if p["type"] != "row"]

    def test_generated_from_render_script(self):
        r = subprocess.run([PYTHON, str(DEPLOY / "grafana" / "render_dashboard.py"), "--check"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_structure(self):
        self.assertTrue(self.d["title"] and self.d["uid"])
        ids = [p["id"] for p in self.d["panels"]]
        self.assertEqual(len(ids), len(set(ids)), "duplicate panel ids")
        variables = {v["name"] for v in self.d["templating"]["list"]}
        self.assertEqual(variables, {"datasource", "namespace", "job", "instance"})
        cells = set()
        for p in self.d["panels"]:
            g = p["gridPos"]
            self.assertLessEqual(g["x"] + g["w"], 24, p["title"])
            for y in range(g["y"], g["y"] + g["h"]):
                for x in range(g["x"], g["x"] + g["w"]):
                    self.assertNotIn((x, y), cells, f"panel {p['title']!r} overlaps another")
                    cells.add((x, y))
        for p in self.panels:
            with self.subTest(panel=p["title"]):
                self.assertEqual(p["datasource"]["uid"], "${datasource}")
                self.assertTrue(p["targets"])
                refs = [t["refId"] for t in p["targets"]]
                self.assertEqual(len(refs), len(set(refs)))
                for t in p["targets"]:
                    self.assertIn('namespace=~"$namespace", job=~"$job", instance=~"$instance"', t["expr"],
                                  "every query follows the namespace, job and pod filters")
                    if "rate(" in t["expr"]:
                        self.assertIn("[$__rate_interval]", t["expr"])

    def panel_exprs(self, title_part: str) -> list[str]:
        found = [p for p in self.panels if title_part.lower() in p["title"].lower()]
        self.assertEqual(len(found), 1, f"expected one panel titled like {title_part!r}")
        return [t["expr"] for t in found[0]["targets"]]

    def test_required_panels(self):
        lat = self.panel_exprs("Request latency")
        self.assertEqual([e.split(",")[0] for e in lat],
                         ["histogram_quantile(0.5", "histogram_quantile(0.95", "histogram_quantile(0.99"])
        self.assertTrue(all("flux2_request_duration_seconds_bucket" in e for e in lat))
        step = self.panel_exprs("Denoising step latency")
        self.assertTrue(all("flux2_denoise_step_duration_seconds_bucket" in e for e in step))
        collectives = self.panel_exprs("Collective time per step")[0]
        self.assertEqual(metric_names(collectives), {"flux2_denoise_step_collective_seconds_sum",
                                                     "flux2_denoise_step_collective_seconds_count"})
        self.assertIn("by (instance, gpu, collective)", collectives)
        self.assertIn("by (stage)", self.panel_exprs("Stage breakdown")[0])
        self.assertIn("flux2_images_generated_total", self.panel_exprs("images/s")[0])
        mp = self.panel_exprs("megapixels/s")[0]
        self.assertIn("flux2_pixels_generated_total", mp)
        self.assertTrue(mp.endswith("/ 1e6"))
        self.assertIn("flux2_queue_depth", self.panel_exprs("Queue depth")[0])
        gpu = set().union(*(metric_names(e) for e in self.panel_exprs("GPU memory")))
        self.assertEqual(gpu, {"flux2_gpu_memory_used_bytes", "flux2_gpu_memory_peak_bytes",
                               "flux2_gpu_memory_total_bytes"})
        self.assertIn("sum by (path, reason)", self.panel_exprs("fallbacks")[0])
        errors = self.panel_exprs("Errors/s by code")[0]
        self.assertIn('code!="OK"', errors)
        self.assertIn("by (code)", errors)
        # GPU utilisation, a success-ratio stat, RESOURCE_EXHAUSTED told apart, both front ends.
        self.assertIn("flux2_gpu_utilization_ratio", self.panel_exprs("GPU utilisation")[0])
        success = self.panel_exprs("Success ratio")[0]
        self.assertIn('code="OK"', success)
        self.assertIn("images.generations|images.edits", success)
        self.assertIn("by (reason)", self.panel_exprs("RESOURCE_EXHAUSTED by reason")[0])
        self.assertIn("images.generations|images.edits", lat[0])

    def test_units(self):
        units = {p["title"]: p["fieldConfig"]["defaults"].get("unit") for p in self.panels}
        for title, unit in units.items():
            if "latency" in title.lower() or "wait" in title.lower():
                self.assertEqual(unit, "s", title)
        self.assertEqual(units["GPU memory"], "bytes")

    def test_loader_in_deploy_common_sees_every_target(self):
        n_targets = sum(len(p["targets"]) for p in self.panels)
        self.assertEqual(len([w for w, _ in __import__("deploy_common").dashboard_exprs()
                              if not w.startswith("variable")]), n_targets)
        self.assertEqual(dashboard()["uid"], self.d["uid"])


if __name__ == "__main__":
    sys.argv[1:1] = ["-v"]
    unittest.main()
