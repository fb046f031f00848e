#!/usr/bin/env python3
# Renders deploy/grafana/flux2-dashboard.json (Grafana dashboard for flux2_server) from the panel list below.
# Tested by tests/deploy/test_dashboard.py (--check, structure, required panels) and the metric-name tests.
"""Usage: render_dashboard.py [--check]

Every PromQL expression uses the metrics of server/ops/METRICS.md only (no recording rules), so the
dashboard works on any Prometheus that scrapes the pods. `$namespace`, `$job` and `$instance` filter
the pods (a Prometheus without Kubernetes labels matches them all); `$__rate_interval` is Grafana's
scrape-aware rate window. --check exits 1 when the committed JSON differs.
"""
import json
import pathlib
import sys

OUT = pathlib.Path(__file__).resolve().parent / "flux2-dashboard.json"
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'namespace=~"$namespace", job=~"$job", instance=~"$instance"'
RATE = "[$__rate_interval]"
# Generation requests of both front ends: gRPC and the OpenAI-compatible HTTP API.
GEN_METHODS = 'method=~"GenerateImage|GenerateImageStream|images.generations|images.edits"'


def quantile(q: float, metric: str, by: str, matchers: str = SEL) -> str:
    return (f"histogram_quantile({q}, sum by ({by}) "
            f"(rate({metric}_bucket{{{matchers}}}{RATE})))")


def target(expr: str, legend: str, ref: str, instant: bool = False) -> dict:
    t = {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref}
    if instant:
        t.update({"instant": True, "range": False, "format": "table"})
    return t


def timeseries(title: str, description: str, unit: str, targets: list, stack: bool = False) -> dict:
    custom = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 20 if stack else 5,
              "showPoints": "never", "spanNulls": False,
              "stacking": {"mode": "normal" if stack else "none", "group": "A"}}
    return {"type": "timeseries", "title": title, "description": description, "datasource": DS,
            "targets": targets,
            "fieldConfig": {"defaults": {"unit": unit, "min": 0, "custom": custom}, "overrides": []},
            "options": {"legend": {"displayMode": "table", "placement": "bottom",
                                   "calcs": ["mean", "max", "lastNotNull"]},
                        "tooltip": {"mode": "multi", "sort": "desc"}}}


def stat(title: str, description: str, unit: str, targets: list) -> dict:
    return {"type": "stat", "title": title, "description": description, "datasource": DS,
            "targets": targets, "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "colorMode": "value", "graphMode": "area", "textMode": "auto"}}


def table(title: str, description: str, targets: list) -> dict:
    return {"type": "table", "title": title, "description": description, "datasource": DS,
            "targets": targets, "fieldConfig": {"defaults": {}, "overrides": []},
            "transformations": [{"id": "organize", "options": {
                "excludeByName": {"Time": True, "Value": True, "__name__": True}}}]}


def row(title: str) -> dict:
    return {"type": "row", "title": title, "collapsed": False, "panels": []}


def panels() -> list:
    gen = f"{GEN_METHODS}, {SEL}"
    return [
        row("Requests"),
        timeseries(
            "Request latency p50 / p95 / p99", "Wall time of the generation requests (gRPC GenerateImage "
            "and GenerateImageStream, HTTP images.generations and images.edits), arrival to reply, across "
            "the selected pods.", "s",
            [target(quantile(q, "flux2_request_duration_seconds", "le", gen), f"p{int(q * 100)}", ref)
             for q, ref in ((0.5, "A"), (0.95, "B"), (0.99, "C"))]),
        timeseries(
            "Throughput: images/s", "Images returned per second, and the reference images of the editing "
            "requests that returned them.", "ops",
            [target(f"sum(rate(flux2_images_generated_total{{{SEL}}}{RATE}))", "images/s", "A"),
             target(f"sum(rate(flux2_reference_images_total{{{SEL}}}{RATE}))", "reference images/s", "B")]),
        timeseries(
            "Throughput: megapixels/s", "Width x height of every returned image, in megapixels per second.",
            "none",
            [target(f"sum(rate(flux2_pixels_generated_total{{{SEL}}}{RATE})) / 1e6", "MP/s", "A")]),
        timeseries(
            "Requests/s by status code", "Finished RPCs per second by gRPC status code and method.", "reqps",
            [target(f"sum by (method, code) (rate(flux2_requests_total{{{SEL}}}{RATE}))",
                    "{{method}} {{code}}", "A")], stack=True),
        timeseries(
            "Errors/s by code", "Finished RPCs per second whose status is not OK.", "reqps",
            [target(f'sum by (code) (rate(flux2_requests_total{{code!="OK", {SEL}}}{RATE}))', "{{code}}", "A")],
            stack=True),
        timeseries(
            "RESOURCE_EXHAUSTED by reason", "Refusals and failures told apart: queue_full (admission queue "
            "full, HTTP 429: add replicas), device_memory (a request ran out of GPU memory: smaller sizes or "
            "fewer references), request_too_large (HTTP body over --max-request-bytes), response_too_large.",
            "reqps",
            [target(f"sum by (reason) (rate(flux2_resource_exhausted_total{{{SEL}}}{RATE}))", "{{reason}}",
                    "A")], stack=True),
        timeseries(
            "Time to first step p50 / p95", "Arrival to the end of a request's first denoising step (its "
            "first progress event): queue wait, text encode and reference encode plus one step.", "s",
            [target(quantile(q, "flux2_time_to_first_step_seconds", "le"), f"p{int(q * 100)}", ref)
             for q, ref in ((0.5, "A"), (0.95, "B"))]),
        row("Generation"),
        timeseries(
            "Denoising step latency p50 / p95 / p99", "One denoising step (transformer forward(s) + Euler "
            "update), by quality level.", "s",
            [target(quantile(q, "flux2_denoise_step_duration_seconds", "quality, le"),
                    f"p{int(q * 100)} {{{{quality}}}}", ref)
             for q, ref in ((0.5, "A"), (0.95, "B"), (0.99, "C"))]),
        timeseries(
            "Collective time per step by GPU (mean)", "Several GPUs per request (--gpus 2 or more): "
            "the mean time each GPU's collectives took in one denoising step, all_to_all (Ulysses' "
            "exchanges around attention) and all_gather (the velocity's gather, the CFG exchange), the "
            "wait for slower GPUs included; compare with the step latency.", "s",
            [target(f"sum by (instance, gpu, collective) "
                    f"(rate(flux2_denoise_step_collective_seconds_sum{{{SEL}}}{RATE}))"
                    f" / sum by (instance, gpu, collective) "
                    f"(rate(flux2_denoise_step_collective_seconds_count{{{SEL}}}{RATE}))",
                    "{{collective}} {{instance}} gpu {{gpu}}", "A")]),
        timeseries(
            "Stage breakdown (mean seconds per request)", "Mean time per request in each stage: "
            "tokenize, text_encode, reference_encode (editing requests only), denoise, decode, encode.", "s",
            [target(f"sum by (stage) (rate(flux2_stage_duration_seconds_sum{{{SEL}}}{RATE}))"
                    f" / sum by (stage) (rate(flux2_stage_duration_seconds_count{{{SEL}}}{RATE}))",
                    "{{stage}}", "A")], stack=True),
        timeseries(
            "Stage latency p95", "95th percentile of each stage's time per request.", "s",
            [target(quantile(0.95, "flux2_stage_duration_seconds", "stage, le"), "{{stage}}", "A")]),
        timeseries(
            "Prompt cache hit ratio", "Share of generated requests whose prompt embeddings came from the "
            "prompt-embedding cache (no text encode), per pod; 0 with --prompt-cache-bytes 0. A miss "
            "runs the text encoder (streamed from host memory with --text-encoder-offload).", "percentunit",
            [target(f'sum by (instance) (rate(flux2_prompt_cache_requests_total{{result="hit", {SEL}}}{RATE}))'
                    f" / sum by (instance) (rate(flux2_prompt_cache_requests_total{{{SEL}}}{RATE}))",
                    "hit ratio {{instance}}", "A")]),
        timeseries(
            "Step caching: cached share of forwards by block list", "Share of block-list forwards that "
            "reused the cached residual (requests with `cache`; DBCache or a fixed schedule), per list; "
            "each CFG branch counts its own forwards.", "percentunit",
            [target(f'sum by (list) (rate(flux2_step_cache_forwards_total{{decision="cached", {SEL}}}{RATE}))'
                    f" / sum by (list) (rate(flux2_step_cache_forwards_total{{{SEL}}}{RATE}))",
                    "{{list}}", "A")]),
        timeseries(
            "Step caching: relative diff p50 / p95", "DBCache's mean|F_prev - F| / mean|F_prev| where it "
            "was computed: a step is cached while it stays below the request's threshold.", "none",
            [target(quantile(q, "flux2_step_cache_relative_diff", "le"), f"p{int(q * 100)}", ref)
             for q, ref in ((0.5, "A"), (0.95, "B"))]),
        row("Queue"),
        timeseries(
            "Queue depth and requests in flight", "Requests waiting in the admission queue and requests "
            "being generated, per pod.", "none",
            [target(f"sum by (instance) (flux2_queue_depth{{{SEL}}})", "queued {{instance}}", "A"),
             target(f"sum by (instance) (flux2_requests_in_flight{{{SEL}}})", "running {{instance}}", "B")]),
        timeseries(
            "Queue wait p50 / p95 / mean", "Time a request waited in the admission queue (the HPA "
            "scales on the mean).", "s",
            [target(quantile(0.5, "flux2_queue_duration_seconds", "le"), "p50", "A"),
             target(quantile(0.95, "flux2_queue_duration_seconds", "le"), "p95", "B"),
             target(f"sum(rate(flux2_queue_duration_seconds_sum{{{SEL}}}{RATE}))"
                    f" / sum(rate(flux2_queue_duration_seconds_count{{{SEL}}}{RATE}))", "mean", "C")]),
        row("GPU and fast paths"),
        timeseries(
            "GPU utilisation", "Fraction of time a kernel ran on each GPU of each pod (--gpus N: one "
            "series per GPU), and its memory busy time (NVML; CUDA backend). Low utilisation with a "
            "queue means host-side stages dominate.",
            "percentunit",
            [target(f"flux2_gpu_utilization_ratio{{{SEL}}}", "kernels {{instance}} gpu {{gpu}}", "A"),
             target(f"flux2_gpu_memory_busy_ratio{{{SEL}}}", "memory {{instance}} gpu {{gpu}}", "B")]),
        timeseries(
            "GPU power and SM clock", "Power draw (watts) and SM clock (Hz) per pod (NVML).", "watt",
            [target(f"flux2_gpu_power_watts{{{SEL}}}", "power {{instance}} gpu {{gpu}}", "A"),
             target(f"flux2_gpu_sm_clock_hertz{{{SEL}}} / 1e6", "SM MHz {{instance}} gpu {{gpu}}", "B")]),
        timeseries(
            "GPU memory", "Device memory held by the backend, its high-water mark and the device "
            "capacity, per pod (CUDA backend).", "bytes",
            [target(f"flux2_gpu_memory_used_bytes{{{SEL}}}", "used {{instance}} gpu {{gpu}}", "A"),
             target(f"flux2_gpu_memory_peak_bytes{{{SEL}}}", "peak {{instance}} gpu {{gpu}}", "B"),
             target(f"flux2_gpu_memory_total_bytes{{{SEL}}}", "total {{instance}} gpu {{gpu}}", "C")]),
        timeseries(
            "Fast-path fallbacks/s by path and reason", "Eager-chain runs instead of the fused fast path. "
            "Correct results, lower speed.", "ops",
            [target(f"sum by (path, reason) (rate(flux2_fast_path_fallbacks_total{{{SEL}}}{RATE}))",
                    "{{path}} ({{reason}})", "A")], stack=True),
        timeseries(
            "Fast-path invocations/s by path", "Fused fast-path kernel runs.", "ops",
            [target(f"sum by (path) (rate(flux2_fast_path_invocations_total{{{SEL}}}{RATE}))",
                    "{{path}}", "A")], stack=True),
        row("Fleet"),
        stat("Success ratio", "Generation requests answered OK over all finished generation requests "
             "(client errors included), over the dashboard's range.", "percentunit",
             [target(f'sum(increase(flux2_requests_total{{code="OK", {gen}}}[$__range]))'
                     f" / sum(increase(flux2_requests_total{{{gen}}}[$__range]))", "success", "A")]),
        stat("Ready replicas", "Pods whose readiness is SERVING (model loaded, warm, not draining).", "none",
             [target(f"sum(flux2_ready{{{SEL}}})", "ready", "A")]),
        stat("Model load time", "Weight loading + warm-up at start-up, slowest selected pod.", "s",
             [target(f"max(flux2_model_load_duration_seconds{{{SEL}}})", "load", "A")]),
        table("Build and model", "Version, backend and model of each pod.",
              [target(f"flux2_build_info{{{SEL}}}", "", "A", instant=True)]),
        timeseries(
            "Process memory and CPU", "Resident memory (bytes) and CPU cores used per pod (process_*).",
            "bytes",
            [target(f"process_resident_memory_bytes{{{SEL}}}", "RSS {{instance}}", "A"),
             target(f"rate(process_cpu_seconds_total{{{SEL}}}{RATE})", "CPU cores {{instance}}", "B")]),
    ]


def layout(items: list) -> list:
    """Assigns ids and a 24-column grid: rows full width, panels two per line (stats three)."""
    out, y, x, pid = [], 0, 0, 1
    for p in items:
        p = dict(p, id=pid)
        pid += 1
        if p["type"] == "row":
            y += 0 if x == 0 else 8
            x = 0
            p["gridPos"] = {"h": 1, "w": 24, "x": 0, "y": y}
            y += 1
        else:
            w = 8 if p["type"] in ("stat", "table") else 12
            if x + w > 24:
                x, y = 0, y + 8
            p["gridPos"] = {"h": 8, "w": w, "x": x, "y": y}
            x += w
        out.append(p)
    return out


def dashboard() -> dict:
    namespace_query = "label_values(flux2_build_info, namespace)"
    job_query = 'label_values(flux2_build_info{namespace=~"$namespace"}, job)'
    instance_query = 'label_values(flux2_build_info{namespace=~"$namespace", job=~"$job"}, instance)'
    return {
        "title": "FLUX.2 inference (flux2_server)",
        "uid": "flux2-server",
        "description": "Latency per request, stage and denoising step; throughput; queue; GPU memory; "
                       "fast-path fallbacks; errors. Generated by deploy/grafana/render_dashboard.py.",
        "tags": ["flux2", "inference", "gpu"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "timezone": "",
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
             "current": {}, "hide": 0, "refresh": 1},
            {"name": "namespace", "label": "Namespace", "type": "query", "datasource": DS,
             "definition": namespace_query, "query": {"query": namespace_query, "refId": "namespace"},
             "multi": True, "includeAll": True, "allValue": ".*",
             "current": {"text": "All", "value": "$__all"}, "refresh": 2, "sort": 1, "hide": 0},
            {"name": "job", "label": "Job", "type": "query", "datasource": DS,
             "definition": job_query, "query": {"query": job_query, "refId": "job"},
             "multi": True, "includeAll": True, "allValue": ".*",
             "current": {"text": "All", "value": "$__all"}, "refresh": 2, "sort": 1, "hide": 0},
            {"name": "instance", "label": "Pod", "type": "query", "datasource": DS,
             "definition": instance_query, "query": {"query": instance_query, "refId": "instance"},
             "multi": True, "includeAll": True, "allValue": ".*",
             "current": {"text": "All", "value": "$__all"}, "refresh": 2, "sort": 1, "hide": 0},
        ]},
        "panels": layout(panels()),
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if argv[1:] == ["--check"]:
        if OUT.read_text() != text:
            print(f"{OUT} is stale: run {pathlib.Path(__file__).name} to regenerate it", file=sys.stderr)
            return 1
        print(f"{OUT.name} is up to date")
        return 0
    if argv[1:]:
        print(__doc__, file=sys.stderr)
        return 2
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
