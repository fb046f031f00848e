#!/usr/bin/python3
# Kubernetes manifests under deploy/k8s: the object files against their schemas (kubernetes-models); then, with kubectl,
# the base, the components and every overlay rendered by `kubectl kustomize`, held to the same schema and policy checks.
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import yaml

from deploy_common import (ADAPTER_FILE, DEPLOY, K8S, K8S_BASE, K8S_COMPONENTS, K8S_OVERLAYS, NODE_MODULES, REPO,
                           RULES_FILE, adapter_rules, k8s_docs, load_docs, the_object, tool)

CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")}
# Maps whose keys are data, not schema fields.
FREE_FORM = {"labels", "annotations", "matchLabels", "nodeSelector", "limits", "requests", "data"}
RESTRICTED_CONTAINER = {"runAsNonRoot": True, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True}
GPU_PRODUCTS = {"h100": "NVIDIA-H100-80GB-HBM3", "h200": "NVIDIA-H200", "b200": "NVIDIA-B200"}
# The components a cluster with kube-prometheus-stack, prometheus-adapter and an Ingress controller takes together.
CLUSTER_COMPONENTS = ["servicemonitor", "prometheusrule", "hpa", "ingress"]
RELEASE_LABEL = {"release": "kube-prometheus-stack"}


def renders() -> dict[str, tuple[str, list[str]]]:
    """What the render tests build: name -> (directory under deploy/k8s, components added on top)."""
    out = {"base": ("base", [])}
    for c in CLUSTER_COMPONENTS:
        out[f"base+{c}"] = ("base", [c])
    out["base+all"] = ("base", CLUSTER_COMPONENTS)
    for overlay in sorted(p.name for p in K8S_OVERLAYS.iterdir()):
        out[overlay] = (f"overlays/{overlay}", [])
        out[f"{overlay}+all"] = (f"overlays/{overlay}", CLUSTER_COMPONENTS)
    # FLUX.2-dev on H100 80GB: the 80 GB memory plan.
    out["h100+text-encoder-offload"] = ("overlays/h100", ["text-encoder-offload"])
    out["h100+all+text-encoder-offload"] = ("overlays/h100", CLUSTER_COMPONENTS + ["text-encoder-offload"])
    return out


def readme_example() -> tuple[str, str]:
    """(directory under deploy/k8s, kustomization) of the example deploy/README.md shows (marked for this test)."""
    text = (DEPLOY / "README.md").read_text()
    m = re.search(r"<!-- k8s-example: (\S+) [^\n]*-->\n```yaml\n(.*?)```", text, re.S)
    assert m, "deploy/README.md has no <!-- k8s-example: DIR ... --> yaml block"
    return m.group(1), m.group(2)


def arg_value(args: list[str], flag: str) -> str:
    """Value of `--flag value` or `--flag=value` in a container's args."""
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    raise AssertionError(f"container args have no {flag}: {args}")


def known_field_names() -> set[str]:
    """Every property name some kubernetes-models schema knows."""
    known = set()
    schema_files = [*(NODE_MODULES / "kubernetes-models" / "_schemas").glob("*.js"),
                    *(NODE_MODULES / "@kubernetes-models" / "apimachinery" / "_schemas").glob("*.js")]
    for f in schema_files:
        text = f.read_text()
        known |= set(re.findall(r'parentDataProperty:"([^"]+)"', text))
        known |= set(re.findall(r"data\.([A-Za-z_$][\w$]*)", text))
        known |= set(re.findall(r'data\["([^"]+)"\]', text))
    return known


def field_paths(node, path=()):
    """(key, path) of every schema field of an object, skipping the free-form maps."""
    if isinstance(node, dict):
        # Service.spec.selector is a plain label map; label selectors have matchLabels.
        plain_selector = path[-1:] == ("selector",) and not {"matchLabels", "matchExpressions"} & set(node)
        for k, v in node.items():
            if path and (path[-1] in FREE_FORM or plain_selector):
                continue
            yield k, path + (k,)
            yield from field_paths(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from field_paths(v, path + (str(i),))


def validate_schemas(docs: list[dict]) -> list[dict]:
    """validate_k8s.mjs over [{file, index, doc}]: one result per doc."""
    r = subprocess.run([tool("node"), str(REPO / "tests/deploy/validate_k8s.mjs"), "--models",
                        str(NODE_MODULES / "kubernetes-models")], input=json.dumps(docs),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    results = json.loads(r.stdout)
    assert len(results) == len(docs)
    return results


@functools.cache
def kubectl_or_reason() -> tuple[str | None, str]:
    """(kubectl, "") when it can render kustomize Components (kubectl >= 1.21, kustomize >= 4), else (None, why)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return None, ("kubectl is not installed, so overlays and components are not rendered. Debian 12's "
                      "kubernetes-client (1.20, kustomize 2.0) cannot render kustomize Components: install kubectl "
                      ">= 1.21 from the Kubernetes apt repository to run these checks")
    r = subprocess.run([kubectl, "version", "--client", "-o", "json"], capture_output=True, text=True, timeout=60)
    minor = re.match(r"\d+", json.loads(r.stdout)["clientVersion"]["minor"]) if r.returncode == 0 else None
    if minor is None or int(minor.group()) < 21:
        return None, f"{kubectl} is older than 1.21 (its kustomize cannot render Components): {r.stdout[:200]}"
    return kubectl, ""


@functools.cache
def rendered() -> dict[str, list[dict]]:
    """name -> the objects `kubectl kustomize` builds, for every entry of renders() and the README example.
    Each is built from a copy of deploy/k8s, as a user's kustomization next to it would be."""
    kubectl, _ = kubectl_or_reason()
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        tree = shutil.copytree(K8S, f"{tmp}/k8s")
        targets = {}
        for name, (directory, components) in renders().items():
            if not components:
                targets[name] = f"{tree}/{directory}"
                continue
            targets[name] = f"{tree}/renders/{name}"
            kust = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                    "resources": [f"../../{directory}"], "components": [f"../../components/{c}" for c in components]}
            os.makedirs(targets[name])
            with open(f"{targets[name]}/kustomization.yaml", "w") as f:
                yaml.safe_dump(kust, f)
        example_dir, example = readme_example()
        targets["readme-example"] = f"{tree}/{example_dir}"
        os.makedirs(targets["readme-example"])
        with open(f"{targets['readme-example']}/kustomization.yaml", "w") as f:
            f.write(example)
        for name, target in targets.items():
            r = subprocess.run([kubectl, "kustomize", target], capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, f"kubectl kustomize ({name}): {r.stderr}"
            out[name] = [d for d in yaml.safe_load_all(r.stdout) if d]
    return out


def squeeze(node):
    """The same data with runs of whitespace in strings made one space."""
    if isinstance(node, dict):
        return {k: squeeze(v) for k, v in node.items()}
    if isinstance(node, list):
        return [squeeze(v) for v in node]
    return " ".join(node.split()) if isinstance(node, str) else node


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [d for d in by_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def server_container(dep: dict) -> dict:
    (server,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "server"]
    return server


class SchemaTest(unittest.TestCase):
    """The object files (base and components), without kubectl."""

    def test_every_object_validates_against_its_kubernetes_schema(self):
        docs = [{"file": str(p.relative_to(REPO)), "index": i, "doc": d}
                for p, i, d in k8s_docs() if (d.get("apiVersion"), d.get("kind")) not in CRD_KINDS]
        self.assertGreaterEqual(len(docs), 8)
        for res in validate_schemas(docs):
            with self.subTest(file=res["file"], kind=res["kind"]):
                self.assertTrue(res["ok"], f"{res['file']} {res['kind']}/{res.get('name')}: {res.get('error')}")

    def test_object_files_hold_whole_objects(self):
        # Patches live inline in kustomization.yaml; every other file is a complete object.
        for p, i, doc in k8s_docs():
            with self.subTest(file=str(p.relative_to(K8S)), index=i):
                self.assertTrue(doc.get("apiVersion") and doc.get("kind") and doc.get("metadata", {}).get("name"))

    def test_no_unknown_field_names(self):
        # kubernetes-models' schemas accept unknown properties, so a misspelt field (readinesProbe)
        # would pass silently; every key we use must be a property name some schema knows.
        known = known_field_names()
        self.assertTrue({"readinessProbe", "labels", "matchLabels"} <= known)
        for p, _, doc in k8s_docs():
            if (doc.get("apiVersion"), doc.get("kind")) in CRD_KINDS:
                continue
            for key, path in field_paths(doc):
                with self.subTest(file=p.name, path=".".join(path)):
                    self.assertTrue(key in known, f"{p.name}: unknown field {'.'.join(path)}")


class CustomResourceTest(unittest.TestCase):
    def test_service_monitor_selects_the_headless_service_metrics_port(self):
        sm = the_object("ServiceMonitor")
        self.assertEqual(set(sm), {"apiVersion", "kind", "metadata", "spec"})
        self.assertLessEqual(set(sm["spec"]), {"selector", "endpoints", "namespaceSelector", "jobLabel"})
        self.assertLessEqual(RELEASE_LABEL.items(), sm["metadata"]["labels"].items())
        services = [d for p, _, d in k8s_docs() if d["kind"] == "Service"]
        wanted = sm["spec"]["selector"]["matchLabels"].items()
        selected = [s for s in services if wanted <= s["metadata"]["labels"].items()]
        self.assertTrue(sm["spec"]["endpoints"])
        for ep in sm["spec"]["endpoints"]:
            self.assertLessEqual(set(ep), {"port", "path", "scheme", "interval", "scrapeTimeout"})
            # Exactly one selected Service exposes the port, so every pod is scraped once.
            exposing = [s for s in selected if ep["port"] in {p["name"] for p in s["spec"]["ports"]}]
            self.assertEqual([s["metadata"]["name"] for s in exposing], ["flux2-server"])
            self.assertEqual(exposing[0]["spec"]["clusterIP"], "None")
            self.assertEqual(ep.get("path", "/metrics"), "/metrics")
            self.assertRegex(ep["interval"], r"^\d+[smh]$")
            self.assertLess(int(ep["scrapeTimeout"][:-1]), int(ep["interval"][:-1]))

    def test_prometheus_rule_structure(self):
        pr = the_object("PrometheusRule")
        self.assertEqual(set(pr), {"apiVersion", "kind", "metadata", "spec"})
        self.assertEqual(set(pr["spec"]), {"groups"})
        names = [g["name"] for g in pr["spec"]["groups"]]
        self.assertEqual(len(names), len(set(names)), "group names must be unique")
        for group in pr["spec"]["groups"]:
            self.assertLessEqual(set(group), {"name", "interval", "rules"})
            for rule in group["rules"]:
                with self.subTest(rule=rule.get("alert") or rule.get("record")):
                    self.assertEqual(len({"alert", "record"} & set(rule)), 1)
                    self.assertIsInstance(rule["expr"], str)
                    if "alert" in rule:
                        self.assertLessEqual(set(rule), {"alert", "expr", "for", "labels", "annotations"})
                        self.assertIn(rule["labels"]["severity"], {"warning", "critical"})
                        self.assertTrue(rule["annotations"]["summary"])
                        self.assertTrue(rule["annotations"]["description"])
                    else:
                        self.assertLessEqual(set(rule), {"record", "expr", "labels"})
                        self.assertRegex(rule["record"], r"^[a-z_]+:[a-z0-9_]+:[a-z0-9_]+$")


class KustomizationTest(unittest.TestCase):
    """Layout checks that need no kubectl."""

    def test_base_lists_every_file_and_needs_no_operator(self):
        kust = load_docs(K8S_BASE / "kustomization.yaml")[0]
        self.assertEqual(kust["kind"], "Kustomization")
        resources = kust["resources"]
        self.assertEqual(len(resources), len(set(resources)), "duplicate resources")
        on_disk = {p.name for p in K8S_BASE.glob("*.yaml")} - {"kustomization.yaml"}
        self.assertEqual(set(resources), on_disk)
        # `kubectl apply -k deploy/k8s/base` works on a cluster without prometheus-operator or prometheus-adapter.
        kinds = {d["kind"] for r in resources for d in load_docs(K8S_BASE / r)}
        self.assertFalse(kinds & {"ServiceMonitor", "PrometheusRule", "HorizontalPodAutoscaler", "Ingress"}, kinds)

    def test_components_are_components_listing_every_file(self):
        components = sorted(p for p in K8S_COMPONENTS.iterdir())
        self.assertEqual({p.name for p in components},
                         set(CLUSTER_COMPONENTS) | {"text-encoder-offload"})
        for comp in components:
            with self.subTest(component=comp.name):
                kust = load_docs(comp / "kustomization.yaml")[0]
                self.assertEqual((kust["apiVersion"], kust["kind"]), ("kustomize.config.k8s.io/v1alpha1", "Component"))
                on_disk = {p.name for p in comp.glob("*.yaml")} - {"kustomization.yaml"}
                self.assertEqual(set(kust.get("resources", [])), on_disk)

    def test_overlays_build_on_the_base(self):
        overlays = sorted(p for p in K8S_OVERLAYS.iterdir())
        self.assertEqual({p.name for p in overlays}, set(GPU_PRODUCTS) | {"cpu-demo"})
        for overlay in overlays:
            with self.subTest(overlay=overlay.name):
                self.assertEqual([p.name for p in overlay.iterdir()], ["kustomization.yaml"])
                kust = load_docs(overlay / "kustomization.yaml")[0]
                self.assertEqual(kust["resources"], ["../../base"])
                # Components stay the user's choice: an overlay that included one could not be used without it.
                self.assertNotIn("components", kust)


class RenderTest(unittest.TestCase):
    """`kubectl kustomize` of the base, the components and the overlays (renders()), and the README's example."""

    def setUp(self):
        kubectl, why = kubectl_or_reason()
        if kubectl is None:
            self.skipTest(why)
        self.renders = rendered()

    def test_every_component_and_overlay_is_rendered(self):
        used = {d for d, _ in renders().values()} | {f"components/{c}" for _, cs in renders().values() for c in cs}
        on_disk = {f"{p.parent.name}/{p.name}" for d in (K8S_COMPONENTS, K8S_OVERLAYS) for p in d.iterdir()}
        self.assertLessEqual(on_disk, used)

    def test_renders_build_the_expected_objects(self):
        base = {(d["kind"], d["metadata"]["name"]) for p, _, d in k8s_docs() if p.parent == K8S_BASE}
        adds = {c: {(d["kind"], d["metadata"]["name"]) for p, _, d in k8s_docs() if p.parent.name == c}
                for c in CLUSTER_COMPONENTS}
        for name, (directory, components) in renders().items():
            with self.subTest(render=name):
                want = set(base) - ({("PersistentVolumeClaim", "flux2-weights")} if "cpu-demo" in directory else set())
                for c in components:
                    want |= adds.get(c, set())
                got = [(d["kind"], d["metadata"]["name"]) for d in self.renders[name]]
                self.assertEqual(len(got), len(set(got)), "duplicate objects")
                self.assertEqual(set(got), want)

    def test_rendered_objects_validate_against_their_schemas(self):
        docs = [{"file": name, "index": i, "doc": d} for name, objs in self.renders.items()
                for i, d in enumerate(objs) if (d["apiVersion"], d["kind"]) not in CRD_KINDS]
        for res in validate_schemas(docs):
            with self.subTest(render=res["file"], kind=res["kind"], name=res.get("name")):
                self.assertTrue(res["ok"], res.get("error"))
        known = known_field_names()
        for name, objs in self.renders.items():
            for d in objs:
                if (d["apiVersion"], d["kind"]) in CRD_KINDS:
                    continue
                unknown = [".".join(p) for k, p in field_paths(d) if k not in known]
                with self.subTest(render=name, kind=d["kind"]):
                    self.assertEqual(unknown, [])

    def test_deployment_policy(self):
        for name, objs in self.renders.items():
            with self.subTest(render=name):
                self.check_deployment(objs)

    def check_deployment(self, objs):
        dep = one(objs, "Deployment", "flux2-server")
        pod = dep["spec"]["template"]["spec"]
        server = server_container(dep)
        self.assertEqual(len(pod["containers"]), 1)
        args = server["args"]
        # Probes: gRPC health services on the gRPC port for start-up and liveness; readiness over
        # HTTP /ready while the HTTP API is on (the same server state, and HTTP itself answering).
        port = int(arg_value(args, "--port"))
        ports = {p["name"]: p["containerPort"] for p in server["ports"]}
        self.assertEqual(ports, {"grpc": port, "metrics": int(arg_value(args, "--metrics-port")),
                                 "http": int(arg_value(args, "--http-port"))})
        for probe, service in (("startupProbe", "readiness"), ("livenessProbe", "liveness")):
            self.assertEqual(server[probe]["grpc"], {"port": port, "service": service}, probe)
        if int(arg_value(args, "--http-port")) >= 0:
            self.assertEqual(server["readinessProbe"]["httpGet"], {"port": "http", "path": "/ready"})
        else:
            self.assertEqual(server["readinessProbe"]["grpc"], {"port": port, "service": "readiness"})
        startup = server["startupProbe"]
        # Weight loading + warm-up of FLUX.2-dev from a network volume: at least 10 minutes.
        self.assertGreaterEqual(startup["periodSeconds"] * startup["failureThreshold"], 600)
        self.assertGreaterEqual(server["livenessProbe"]["failureThreshold"], 3)
        # Drain budget: SIGKILL never cuts a drain short.
        pre_stop = server["lifecycle"]["preStop"]["exec"]["command"]
        self.assertEqual(pre_stop[0], "sleep")
        drain = float(arg_value(args, "--drain-timeout-s"))
        self.assertGreater(pod["terminationGracePeriodSeconds"], int(pre_stop[1]) + drain)
        self.assertGreaterEqual(drain, 300, "the drain must outlast the longest generation (minutes)")
        # The restricted Pod Security profile.
        psc = pod["securityContext"]
        self.assertTrue(psc["runAsNonRoot"])
        self.assertNotEqual(psc.get("runAsUser", 0), 0)
        self.assertEqual(psc["seccompProfile"], {"type": "RuntimeDefault"})
        self.assertFalse(pod.get("hostNetwork", False) or pod.get("hostPID", False))
        self.assertFalse(pod["automountServiceAccountToken"])
        for c in pod["containers"] + pod.get("initContainers", []):
            sc = c["securityContext"]
            for key, want in RESTRICTED_CONTAINER.items():
                self.assertEqual(sc.get(key), want, f"{c['name']}: {key}")
            self.assertEqual(sc["capabilities"], {"drop": ["ALL"]})
            self.assertNotIn("privileged", sc)
            self.assertIn("limits", c["resources"])
        mounts = {m["mountPath"]: m for m in server["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        self.assertIn("emptyDir", volumes[mounts["/tmp"]["name"]], "the root filesystem is read-only")
        # Selectors: the Services and the PDB select exactly the Deployment's pods.
        pod_labels = dep["spec"]["template"]["metadata"]["labels"]
        selectors = [dep["spec"]["selector"]["matchLabels"], one(objs, "PodDisruptionBudget")["spec"]["selector"][
            "matchLabels"]] + [s["spec"]["selector"] for s in by_kind(objs, "Service")]
        for sel in selectors:
            self.assertTrue(sel)
            self.assertLessEqual(sel.items(), pod_labels.items())
        # Services: headless for gRPC client-side balancing (+ the scrape), ClusterIP for the HTTP API.
        headless, api = one(objs, "Service", "flux2-server"), one(objs, "Service", "flux2-server-api")
        self.assertEqual(headless["spec"]["clusterIP"], "None")
        self.assertEqual({p["name"] for p in headless["spec"]["ports"]}, {"grpc", "metrics"})
        self.assertEqual(api["spec"].get("type", "ClusterIP"), "ClusterIP")
        self.assertNotIn("clusterIP", api["spec"])
        self.assertEqual({p["name"]: p["port"] for p in api["spec"]["ports"]}, {"http": 8000, "grpc": 50051})
        for svc in (headless, api):
            for p in svc["spec"]["ports"]:
                self.assertIn(p["targetPort"], ports)
        # Replicas: one without the hpa component, the HPA's with it; never both.
        self.assertNotIn("replicas", dep["spec"], "the HPA (or the default of one) owns the replica count")
        images = {c["image"] for c in pod["containers"] + pod.get("initContainers", [])}
        tag = load_docs(K8S_BASE / "kustomization.yaml")[0]["images"][0]["newTag"]
        # One image for the server and the init container, the base's tag (a kustomization may set a registry).
        self.assertEqual(len(images), 1)
        self.assertTrue(images.pop().endswith(f"flux2-server:{tag}"))

    def test_gpu_renders(self):
        # The base and the GPU overlays: one GPU, --backend cuda, weights from the verified read-only PVC.
        for name, (directory, _) in renders().items():
            if "cpu-demo" in directory:
                continue
            with self.subTest(render=name):
                objs = self.renders[name]
                dep = one(objs, "Deployment")
                pod = dep["spec"]["template"]["spec"]
                server = server_container(dep)
                self.assertEqual(server["resources"]["limits"]["nvidia.com/gpu"], 1)
                self.assertNotIn("nvidia.com/gpu", server["resources"]["requests"])
                self.assertEqual(arg_value(server["args"], "--backend"), "cuda",
                                 "a pod whose GPU is unusable must fail, not serve on the CPU")
                self.assertIn("nvidia.com/gpu", {t["key"] for t in pod["tolerations"]})
                self.assertNotIn("command", server, "the image's ENTRYPOINT passes --model-dir /models")
                overlay = directory.removeprefix("overlays/")
                if overlay in GPU_PRODUCTS:
                    self.assertEqual(pod["nodeSelector"], {"nvidia.com/gpu.product": GPU_PRODUCTS[overlay]})
                else:
                    self.assertNotIn("nodeSelector", pod)
                self.check_weights(objs, pod, server)

    def check_weights(self, objs, pod, server):
        volumes = {v["name"]: v for v in pod["volumes"]}
        models = {m["mountPath"]: m for m in server["volumeMounts"]}["/models"]
        self.assertTrue(models["readOnly"])
        pvc = volumes[models["name"]]["persistentVolumeClaim"]
        self.assertTrue(pvc["readOnly"])
        claim = one(objs, "PersistentVolumeClaim", pvc["claimName"])
        self.assertEqual(claim["spec"]["accessModes"], ["ReadWriteOnce"])
        (init,) = pod["initContainers"]
        self.assertEqual(init["image"], server["image"])
        self.assertIn("sha256sum --check --strict", init["command"][-1])
        self.assertIn("cd /models", init["command"][-1])
        self.assertEqual({m["mountPath"]: m["readOnly"] for m in init["volumeMounts"]}, {"/models": True})

    def test_cpu_demo(self):
        # kind or any cluster without GPUs: the embedded tiny checkpoint on the CPU, nothing GPU-shaped.
        for name, (directory, _) in renders().items():
            if "cpu-demo" not in directory:
                continue
            with self.subTest(render=name):
                objs = self.renders[name]
                self.assertEqual(by_kind(objs, "PersistentVolumeClaim"), [])
                dep = one(objs, "Deployment")
                pod = dep["spec"]["template"]["spec"]
                server = server_container(dep)
                self.assertNotIn("nvidia.com", json.dumps(pod), "no GPU resource, toleration or node selector")
                self.assertEqual(server["command"], ["flux2_server"], "no --model-dir: the embedded checkpoint")
                self.assertEqual(arg_value(server["args"], "--backend"), "cpu")
                self.assertNotIn("--model-dir", server["args"])
                self.assertLessEqual(int(arg_value(server["args"], "--max-pixels")), 1024 * 1024)
                self.assertFalse(pod.get("initContainers"))
                self.assertNotIn("/models", {m["mountPath"] for m in server["volumeMounts"]})
                self.assertFalse([v for v in pod["volumes"] if "persistentVolumeClaim" in v])
                self.assertEqual(server["resources"]["limits"]["memory"], "2Gi")

    def test_text_encoder_offload_only_where_asked(self):
        for name, (_, components) in renders().items():
            with self.subTest(render=name):
                server = server_container(one(self.renders[name], "Deployment"))
                offload = server["args"].count("--text-encoder-offload")
                self.assertEqual(offload, int("text-encoder-offload" in components))
                if offload:
                    # The 34.7 GB text encoder is pinned (unreclaimable) host memory.
                    self.assertEqual(server["resources"]["requests"]["memory"], "64Gi")
                    self.assertEqual(server["resources"]["limits"]["memory"], "96Gi")

    def test_monitoring_components(self):
        for name, (_, components) in renders().items():
            objs = self.renders[name]
            with self.subTest(render=name):
                for kind, component in (("ServiceMonitor", "servicemonitor"), ("PrometheusRule", "prometheusrule")):
                    found = by_kind(objs, kind)
                    self.assertEqual(len(found), int(component in components), kind)
                    for obj in found:
                        self.assertLessEqual(RELEASE_LABEL.items(), obj["metadata"]["labels"].items(), kind)
                for pr in by_kind(objs, "PrometheusRule"):
                    # kustomize re-emits folded (>-) scalars with more-indented lines with an extra line break:
                    # the same PromQL; test_rendered_rules_pass_promtool loads what it emits.
                    self.assertEqual(squeeze(pr["spec"]["groups"]), squeeze(load_docs(RULES_FILE)[0]["groups"]))
                for sm in by_kind(objs, "ServiceMonitor"):
                    for ep in sm["spec"]["endpoints"]:
                        exposing = [s["metadata"]["name"] for s in by_kind(objs, "Service")
                                    if sm["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
                                    and ep["port"] in {p["name"] for p in s["spec"]["ports"]}]
                        self.assertEqual(exposing, ["flux2-server"])

    def test_rendered_rules_pass_promtool(self):
        # What prometheus-operator receives from `kubectl apply -k` must load as a rules file.
        pr = one(self.renders["base+prometheusrule"], "PrometheusRule")
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            yaml.safe_dump(pr["spec"], f)
            f.flush()
            r = subprocess.run([tool("promtool"), "check", "rules", f.name], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_hpa_scales_the_deployment_on_adapter_queue_metrics(self):
        for name, (_, components) in renders().items():
            objs = self.renders[name]
            with self.subTest(render=name):
                self.assertEqual(len(by_kind(objs, "HorizontalPodAutoscaler")), int("hpa" in components))
                if "hpa" not in components:
                    continue
                hpa, dep = one(objs, "HorizontalPodAutoscaler"), one(objs, "Deployment")
                self.assertEqual(hpa["apiVersion"], "autoscaling/v2")
                ref = hpa["spec"]["scaleTargetRef"]
                self.assertEqual((ref["kind"], ref["name"]), ("Deployment", dep["metadata"]["name"]))
                self.assertGreaterEqual(hpa["spec"]["minReplicas"], 2)
                served = {r["name"]["as"] for r in adapter_rules()}
                names = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]]
                self.assertTrue(names)
                for m in hpa["spec"]["metrics"]:
                    self.assertEqual(m["type"], "Pods")
                self.assertIn("flux2_queue_wait_seconds", names)
                self.assertLessEqual(set(names), served, f"HPA metrics not served by {ADAPTER_FILE.name}")
                pdb = one(objs, "PodDisruptionBudget")
                self.assertLess(pdb["spec"]["maxUnavailable"], hpa["spec"]["minReplicas"])

    def test_ingress_routes_to_the_http_api(self):
        for name, (_, components) in renders().items():
            objs = self.renders[name]
            with self.subTest(render=name):
                self.assertEqual(len(by_kind(objs, "Ingress")), int("ingress" in components))
                for ing in by_kind(objs, "Ingress"):
                    for rule in ing["spec"]["rules"]:
                        for path in rule["http"]["paths"]:
                            backend = path["backend"]["service"]
                            svc = one(objs, "Service", backend["name"])
                            self.assertIn(backend["port"]["name"], {p["name"] for p in svc["spec"]["ports"]})
                            self.assertEqual(backend["port"]["name"], "http")

    def test_readme_example(self):
        # deploy/README.md's production kustomization: registry and tag, storage class, release label, components.
        objs = self.renders["readme-example"]
        dep = one(objs, "Deployment")
        images = {c["image"] for c in dep["spec"]["template"]["spec"]["containers"]
                  + dep["spec"]["template"]["spec"]["initContainers"]}
        self.assertEqual(images, {"registry.example.com/flux2-server:0.1.0"})
        self.assertEqual(one(objs, "PersistentVolumeClaim")["spec"]["storageClassName"], "standard-rwo")
        for kind in ("ServiceMonitor", "PrometheusRule"):
            self.assertEqual(one(objs, kind)["metadata"]["labels"]["release"], "prometheus")
        self.assertEqual(server_container(dep)["args"].count("--text-encoder-offload"), 1)
        self.assertEqual(one(objs, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]["name"], "flux2-server")
        self.assertTrue(all(d["metadata"].get("namespace") == "flux2" for d in objs))


if __name__ == "__main__":
    sys.argv[1:1] = ["-v"]
    unittest.main()
