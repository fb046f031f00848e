# Statistics of a load-generation run: nearest-rank percentiles, latency summaries, status distribution.
# Tested by tests/deploy/test_loadgen_stats.py against a brute-force percentile and hand-computed reports.
"""Pure functions (no gRPC) so they can be tested alone; flux2_loadgen.py feeds them samples."""
import math
from collections import Counter
from dataclasses import dataclass

PERCENTILES = (50, 90, 95, 99)


@dataclass(frozen=True)
class Sample:
    """One finished request: seconds from send to last byte, and its gRPC status code name."""
    latency_s: float
    code: str
    images: int = 0


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list: the smallest value v such that at least p% of
    the values are <= v (p in (0, 100]). The same definition ghz and perf_analyzer report."""
    if not sorted_values:
        raise ValueError("percentile of an empty list")
    if not 0 < p <= 100:
        raise ValueError(f"percentile p={p} is outside (0, 100]")
    rank = math.ceil(p / 100.0 * len(sorted_values))  # 1-based
    return sorted_values[max(rank, 1) - 1]


def latency_summary(latencies: list[float]) -> dict:
    """min / mean / p50 / p90 / p95 / p99 / max in seconds; an empty dict when there are none."""
    if not latencies:
        return {}
    values = sorted(latencies)
    summary = {"min": values[0], "mean": sum(values) / len(values)}
    for p in PERCENTILES:
        summary[f"p{p}"] = percentile(values, p)
    summary["max"] = values[-1]
    return summary


def build_report(samples: list[Sample], elapsed_s: float, *, target: str, method: str,
                 concurrency: int) -> dict:
    """The run's report: counts, rates over the wall time, latency over all and over OK requests,
    and how many requests ended with each status code."""
    if elapsed_s <= 0:
        raise ValueError(f"elapsed time {elapsed_s} s is not positive")
    ok = [s for s in samples if s.code == "OK"]
    status = Counter(s.code for s in samples)
    return {
        "target": target,
        "method": method,
        "concurrency": concurrency,
        "elapsed_s": elapsed_s,
        "count": len(samples),
        "ok": len(ok),
        "rps": len(samples) / elapsed_s,
        "ok_rps": len(ok) / elapsed_s,
        "images": sum(s.images for s in ok),
        "latency_s": latency_summary([s.latency_s for s in samples]),
        "latency_ok_s": latency_summary([s.latency_s for s in ok]),
        "status": dict(sorted(status.items(), key=lambda kv: (-kv[1], kv[0]))),
    }


def format_report(report: dict) -> str:
    """Human-readable report (the JSON form is the report dict itself)."""
    lines = [
        f"target       {report['target']}  method {report['method']}  concurrency {report['concurrency']}",
        f"duration     {report['elapsed_s']:.2f} s",
        f"count        {report['count']}  (ok {report['ok']}, images {report['images']})",
        f"rps          {report['rps']:.3f}  (ok {report['ok_rps']:.3f})",
    ]
    for key, label in (("latency_s", "latency all"), ("latency_ok_s", "latency ok")):
        lat = report[key]
        if lat:
            parts = "  ".join(f"{name} {lat[name] * 1000:.1f}" for name in
                              ("min", "mean", "p50", "p90", "p95", "p99", "max"))
            lines.append(f"{label:<12} ms: {parts}")
    lines.append("status       " + ", ".join(f"{code} {n}" for code, n in report["status"].items()))
    return "\n".join(lines)
