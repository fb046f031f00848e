#!/usr/bin/python3
# The deploy tests' PromQL scanner (promql.py) and exposition parser (exposition.py), on hand-written expressions
# and scrapes, so the metric-name checks built on them cannot pass by missing names.
import sys
import unittest

import exposition
from promql import grafana_to_promql, metric_names, selectors


class PromqlScannerTest(unittest.TestCase):
    def test_metric_names(self):
        cases = {
            'histogram_quantile(0.99, sum by (le, method) (rate(a_bucket{method=~"x|y"}[5m])))': {"a_bucket"},
            "sum(rate(a_total[5m])) / 1e6": {"a_total"},
            "a / on(path) group_left(reason) b": {"a", "b"},
            "sum without (instance) (a) or vector(0)": {"a"},
            "(sum(a) or vector(0)) < 1": {"a"},
            "a offset 5m > bool 0.5": {"a"},
            "level:a_total:rate5m > 1e-9 and b": {"level:a_total:rate5m", "b"},
            'up{job="x"} == 0': {"up"},
            'count(a{l="sum(b)"})': {"a"},
            "clamp_min(sum by (pod) (rate(a_count[2m])), 1e-9)": {"a_count"},
            'sum(rate(x_sum{instance=~"$instance"}[$__rate_interval])) / sum(rate(x_count[$__rate_interval]))':
                {"x_sum", "x_count"},
            "avg_over_time(q[5m]) > 4": {"q"},
            "NaN": set(),
        }
        for expr, want in cases.items():
            with self.subTest(expr=expr):
                self.assertEqual(metric_names(expr), want)

    def test_selectors(self):
        self.assertEqual(selectors('rate(a{code!="OK", instance=~"$x"}[1m]) / b{method="G"}'),
                         [("a", ["code", "instance"]), ("b", ["method"])])
        self.assertEqual(selectors('sum by (x) (a{l="{}"})'), [("a", ["l"])])

    def test_grafana_substitution(self):
        self.assertEqual(grafana_to_promql('rate(a{i=~"$instance"}[$__rate_interval])', "15s", {"instance": ".*"}),
                         'rate(a{i=~".*"}[15s])')


SCRAPE = '''# HELP flux2_requests_total finished RPCs
# TYPE flux2_requests_total counter
flux2_requests_total{method="GenerateImage",code="OK"} 3
flux2_requests_total{method="GenerateImage",code="INVALID_ARGUMENT"} 1
# HELP flux2_fast_path_fallbacks_total eager runs
# TYPE flux2_fast_path_fallbacks_total counter
# HELP flux2_stage_duration_seconds stage time
# TYPE flux2_stage_duration_seconds histogram
flux2_stage_duration_seconds_count{stage="denoise"} 3
flux2_stage_duration_seconds_sum{stage="denoise"} 1.5
flux2_stage_duration_seconds_bucket{stage="denoise",le="0.5"} 2
flux2_stage_duration_seconds_bucket{stage="denoise",le="+Inf"} 3
# TYPE flux2_build_info gauge
flux2_build_info{version="0.1.0",backend="cpu",model="a \\"quoted\\", name"} 1
'''


class ExpositionTest(unittest.TestCase):
    def test_parse(self):
        fams = exposition.parse(SCRAPE)
        self.assertEqual(fams["flux2_stage_duration_seconds"].type, "histogram")
        self.assertEqual(len(fams["flux2_stage_duration_seconds"].samples), 4)
        names = exposition.exported_names(fams)
        self.assertLessEqual({"flux2_requests_total", "flux2_fast_path_fallbacks_total",
                              "flux2_stage_duration_seconds_bucket", "flux2_stage_duration_seconds_sum",
                              "flux2_stage_duration_seconds_count", "flux2_build_info"}, names)
        self.assertNotIn("flux2_stage_duration_seconds", names)
        self.assertEqual(exposition.value(fams, "flux2_requests_total"), 4)
        self.assertEqual(exposition.value(fams, "flux2_requests_total", code="OK"), 3)
        self.assertEqual(exposition.value(fams, "flux2_stage_duration_seconds_count", stage="denoise"), 3)
        self.assertEqual(exposition.value(fams, "flux2_nothing"), 0)
        (build,) = fams["flux2_build_info"].samples
        self.assertEqual(build[1]["model"], 'a "quoted", name')
        self.assertEqual(exposition.label_names(fams)["flux2_stage_duration_seconds_bucket"], {"stage", "le"})

    def test_malformed(self):
        with self.assertRaises(ValueError):
            exposition.parse("flux2_x{a=b} 1\n")


if __name__ == "__main__":
    sys.argv[1:1] = ["-v"]
    unittest.main()
