#!/usr/bin/python3
# The load generator's statistics (deploy/loadgen/loadgen_stats.py): nearest-rank percentiles against a brute-force
# definition, and a report computed by hand. The live run against a server is in test_prometheus_e2e.py.
import random
import sys
import unittest

from deploy_common import DEPLOY

sys.path.insert(0, str(DEPLOY / "loadgen"))
from loadgen_stats import Sample, build_report, format_report, latency_summary, percentile  # noqa: E402


def brute_force_percentile(values: list[float], p: float) -> float:
    """Smallest sample v with at least p% of the samples <= v, by trying every sample."""
    n = len(values)
    return min(v for v in values if sum(1 for w in values if w <= v) * 100 >= p * n)


class PercentileTest(unittest.TestCase):
    def test_matches_brute_force_definition(self):
        rng = random.Random(7)
        for n in (1, 2, 3, 7, 10, 99, 100, 101, 250):
            values = sorted(rng.choice([rng.random(), 0.5]) for _ in range(n))  # with ties
            for p in (1, 10, 25, 50, 90, 95, 99, 99.9, 100):
                with self.subTest(n=n, p=p):
                    self.assertEqual(percentile(values, p), brute_force_percentile(values, p))

    def test_known_values(self):
        values = [float(i) for i in range(1, 101)]  # 1..100
        self.assertEqual(percentile(values, 50), 50.0)
        self.assertEqual(percentile(values, 90), 90.0)
        self.assertEqual(percentile(values, 99), 99.0)
        self.assertEqual(percentile(values, 100), 100.0)
        self.assertEqual(percentile([3.0], 99), 3.0)

    def test_rejects_bad_input(self):
        with self.assertRaises(ValueError):
            percentile([], 50)
        with self.assertRaises(ValueError):
            percentile([1.0], 0)
        with self.assertRaises(ValueError):
            percentile([1.0], 101)


class ReportTest(unittest.TestCase):
    def test_report_by_hand(self):
        samples = ([Sample(0.1 * (i + 1), "OK", 1) for i in range(8)]
                   + [Sample(0.01, "RESOURCE_EXHAUSTED"), Sample(0.02, "RESOURCE_EXHAUSTED"),
                      Sample(2.0, "DEADLINE_EXCEEDED")])
        r = build_report(samples, 4.0, target="t:1", method="GenerateImage", concurrency=2)
        self.assertEqual(r["count"], 11)
        self.assertEqual(r["ok"], 8)
        self.assertEqual(r["images"], 8)
        self.assertAlmostEqual(r["rps"], 11 / 4.0)
        self.assertAlmostEqual(r["ok_rps"], 2.0)
        self.assertEqual(r["status"], {"OK": 8, "RESOURCE_EXHAUSTED": 2, "DEADLINE_EXCEEDED": 1})
        self.assertEqual(list(r["status"]), ["OK", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"])
        self.assertEqual(sum(r["status"].values()), r["count"])
        ok = r["latency_ok_s"]
        self.assertAlmostEqual(ok["min"], 0.1)
        self.assertAlmostEqual(ok["max"], 0.8)
        self.assertAlmostEqual(ok["mean"], 0.45)
        self.assertAlmostEqual(ok["p50"], 0.4)   # rank ceil(0.5 * 8) = 4
        self.assertAlmostEqual(ok["p90"], 0.8)   # rank ceil(0.9 * 8) = 8
        self.assertEqual(r["latency_s"]["max"], 2.0)
        self.assertEqual(r["latency_s"]["min"], 0.01)
        text = format_report(r)
        for needle in ("count        11", "p99", "status       OK 8, RESOURCE_EXHAUSTED 2, DEADLINE_EXCEEDED 1"):
            self.assertIn(needle, text)

    def test_empty_run(self):
        r = build_report([], 1.0, target="t", method="m", concurrency=1)
        self.assertEqual((r["count"], r["rps"], r["latency_s"], r["status"]), (0, 0.0, {}, {}))
        self.assertEqual(latency_summary([]), {})
        with self.assertRaises(ValueError):
            build_report([], 0.0, target="t", method="m", concurrency=1)


if __name__ == "__main__":
    sys.argv[1:1] = ["-v"]
    unittest.main()
