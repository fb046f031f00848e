# Shared helpers of the deploy tests: repository paths, YAML loading, the metrics contract (server/ops/METRICS.md),
# and the PromQL expressions the dashboard, the rules and the HPA adapter use. Used by tests/deploy/test_*.py.
import json
import os
import pathlib
import re
import shutil

import yaml

REPO = pathlib.Path(os.environ.get("FLUX2_REPO") or pathlib.Path(__file__).resolve().parents[2])
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
K8S_BASE = K8S / "base"
K8S_COMPONENTS = K8S / "components"
K8S_OVERLAYS = K8S / "overlays"
PROMETHEUSRULE_FILE = K8S_COMPONENTS / "prometheusrule" / "prometheusrule.yaml"
RULES_FILE = DEPLOY / "prometheus" / "flux2-rules.yaml"
ADAPTER_FILE = DEPLOY / "prometheus-adapter" / "flux2-adapter-rules.yaml"
DASHBOARD_FILE = DEPLOY / "grafana" / "flux2-dashboard.json"
LOADGEN = DEPLOY / "loadgen" / "flux2_loadgen.py"
METRICS_MD = REPO / "server" / "ops" / "METRICS.md"
NODE_MODULES = REPO / "tests" / "tools" / "node_modules"
# Debian's interpreter: python3-grpcio / python3-protobuf / python3-yaml live there.
PYTHON = "/usr/bin/python3"


def tool(name: str) -> str:
    """Absolute path of a command-line tool; fails the test with the package to install."""
    found = shutil.which(name)
    if found is None:
        raise AssertionError(f"{name} not found on PATH (deploy/install_deps.sh installs it)")
    return found


def load_docs(path: pathlib.Path) -> list:
    """Every non-empty YAML document of a file."""
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def k8s_docs() -> list[tuple[pathlib.Path, int, dict]]:
    """(file, index, object) for every Kubernetes object file under deploy/k8s: the base's and the components'
    resources. Overlays and components keep their patches inline in kustomization.yaml, which is no object;
    test_k8s_manifests.py checks the rendered overlays and component combinations."""
    out = []
    for path in sorted(K8S.rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for i, doc in enumerate(load_docs(path)):
            out.append((path, i, doc))
    return out


def objects_by_kind(kind: str) -> list[dict]:
    return [doc for _, _, doc in k8s_docs() if doc.get("kind") == kind]


def the_object(kind: str) -> dict:
    found = objects_by_kind(kind)
    assert len(found) == 1, f"expected exactly one {kind} in the files under deploy/k8s, found {len(found)}"
    return found[0]


# ---- the metrics contract -------------------------------------------------------------------------

def metrics_contract() -> dict[str, dict]:
    """server/ops/METRICS.md table: name -> {"type", "labels" (set), "cuda_only" (bool),
    "several_gpus_only" (bool: exported only by a server that splits requests over --gpus 2 or more)}."""
    contract = {}
    row = re.compile(r"^\|\s*`(flux2_[a-z0-9_]+)`\s*\|\s*([^|]+)\|\s*([^|]*)\|\s*([^|]*)\|")
    for line in METRICS_MD.read_text().splitlines():
        m = row.match(line)
        if not m:
            continue
        name, mtype, labels, meaning = m.groups()
        mtype = mtype.strip().split()[0]
        contract[name] = {"type": mtype, "labels": set(re.findall(r"`([a-z_]+)`", labels)),
                          "cuda_only": "CUDA only" in meaning,
                          "several_gpus_only": "several GPUs only" in meaning}
    assert contract, f"{METRICS_MD}: no metric table rows found"
    return contract


def series_names(family: str, mtype: str) -> set[str]:
    """Sample names a family exposes in the text format (histograms: _bucket/_sum/_count)."""
    if mtype == "histogram":
        return {family + "_bucket", family + "_sum", family + "_count"}
    if mtype == "summary":
        return {family, family + "_sum", family + "_count"}
    return {family}


# ---- PromQL expressions used by the deployment ----------------------------------------------------

def rules() -> list[dict]:
    """Every rule of deploy/prometheus/flux2-rules.yaml, with its group name added."""
    out = []
    for group in load_docs(RULES_FILE)[0]["groups"]:
        for rule in group["rules"]:
            out.append(dict(rule, group=group["name"]))
    return out


def recording_rule_names() -> set[str]:
    return {r["record"] for r in rules() if "record" in r}


def dashboard() -> dict:
    return json.loads(DASHBOARD_FILE.read_text())


def dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title, expr) for every panel target plus the templating queries."""
    out = []
    for panel in dashboard()["panels"]:
        for t in panel.get("targets", []):
            out.append((panel["title"], t["expr"]))
    for var in dashboard()["templating"]["list"]:
        if var["type"] == "query":
            q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            m = re.fullmatch(r"label_values\((.*),\s*\w+\)", q.strip())
            assert m, f"templating variable {var['name']}: unsupported query {q!r}"
            out.append((f"variable {var['name']}", m.group(1)))
    return out


def adapter_rules() -> list[dict]:
    return load_docs(ADAPTER_FILE)[0]["rules"]["custom"]


def adapter_exprs() -> list[tuple[str, str]]:
    """(adapter metric, expr) with the adapter's template holes filled as the adapter would."""
    out = []
    for rule in adapter_rules():
        name = rule["name"]["as"]
        out.append((name, rule["seriesQuery"]))
        query = rule["metricsQuery"].replace("<<.LabelMatchers>>", 'namespace="default",pod="p"')
        out.append((name, query.replace("<<.GroupBy>>", "pod")))
    return out


def all_exprs() -> list[tuple[str, str]]:
    """Every PromQL expression of the deployment: (where, expr)."""
    return ([("dashboard: " + w, e) for w, e in dashboard_exprs()]
            + [(f"rule {r.get('alert') or r.get('record')}", r["expr"]) for r in rules()]
            + [("adapter " + w, e) for w, e in adapter_exprs()])
