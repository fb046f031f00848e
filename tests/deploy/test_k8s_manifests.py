#!/usr/bin/python3
# Kubernetes manifests under deploy/k8s: schema validation (kubernetes-models), CRD structure, kustomization
# completeness, and the deployment policy of issue 7 (GPU, probes, drain budget, restricted security, weights).
import json
import re
import shutil
import subprocess
import sys
import unittest

from deploy_common import (ADAPTER_FILE, DEPLOY, K8S_BASE, NODE_MODULES, REPO, adapter_rules, k8s_docs,
                           load_docs, objects_by_kind, the_object, tool)

CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")}
# Maps whose keys are data, not schema fields.
FREE_FORM = {"labels", "annotations", "matchLabels", "nodeSelector", "limits", "requests", "data"}
RESTRICTED_CONTAINER = {"runAsNonRoot": True, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True}


def arg_value(args: list[str], flag: str) -> str:
    """Value of `--flag value` or `--flag=value` in a container's args."""
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    raise AssertionError(f"container args have no {flag}: {args}")


class SchemaTest(unittest.TestCase):
    def test_every_object_validates_against_its_kubernetes_schema(self):
        docs = [{"file": str(p.relative_to(REPO)), "index": i, "doc": d}
                for p, i, d in k8s_docs() if (d.get("apiVersion"), d.get("kind")) not in CRD_KINDS]
        self.assertGreaterEqual(len(docs), 6)
        r = subprocess.run([tool("node"), str(REPO / "tests/deploy/validate_k8s.mjs"), "--models",
                            str(NODE_MODULES / "kubernetes-models")], input=json.dumps(docs),
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        results = json.loads(r.stdout)
        self.assertEqual(len(results), len(docs))
        for res in results:
            with self.subTest(file=res["file"], kind=res["kind"]):
                self.assertTrue(res["ok"], f"{res['file']} {res['kind']}/{res.get('name')}: {res.get('error')}")

    def test_no_unknown_field_names(self):
        # kubernetes-models' schemas accept unknown properties, so a misspelt field (readinesProbe)
        # would pass silently; every key we use must be a property name some schema knows.
        known = set()
        schema_files = [*(NODE_MODULES / "kubernetes-models" / "_schemas").glob("*.js"),
                        *(NODE_MODULES / "@kubernetes-models" / "apimachinery" / "_schemas").glob("*.js")]
        for f in schema_files:
            text = f.read_text()
            known |= set(re.findall(r'parentDataProperty:"([^"]+)"', text))
            known |= set(re.findall(r"data\.([A-Za-z_$][\w$]*)", text))
            known |= set(re.findall(r'data\["([^"]+)"\]', text))
        self.assertTrue({"readinessProbe", "labels", "matchLabels"} <= known)

        def walk(node, path):
            if isinstance(node, dict):
                # Service.spec.selector is a plain label map; label selectors have matchLabels.
                plain_selector = path[-1:] == ["selector"] and not {"matchLabels", "matchExpressions"} & set(node)
                for k, v in node.items():
                    if path and (path[-1] in FREE_FORM or plain_selector):
                        continue
                    yield k, path + [k]
                    yield from walk(v, path + [k])
            elif isinstance(node, list):
                for i, v in enumerate(node):
                    yield from walk(v, path + [str(i)])

        for p, _, doc in k8s_docs():
            if (doc.get("apiVersion"), doc.get("kind")) in CRD_KINDS:
                continue
            for key, path in walk(doc, []):
                with self.subTest(file=p.name, path=".".join(path)):
                    self.assertTrue(key in known, f"{p.name}: unknown field {'.'.join(path)}")


class CustomResourceTest(unittest.TestCase):
    def test_service_monitor_selects_the_service_metrics_port(self):
        sm, svc = the_object("ServiceMonitor"), the_object("Service")
        self.assertEqual(set(sm), {"apiVersion", "kind", "metadata", "spec"})
        self.assertLessEqual(set(sm["spec"]), {"selector", "endpoints", "namespaceSelector", "jobLabel"})
        labels = svc["metadata"]["labels"]
        for k, v in sm["spec"]["selector"]["matchLabels"].items():
            self.assertEqual(labels.get(k), v, f"ServiceMonitor selector {k}={v} does not match the Service")
        port_names = {p["name"] for p in svc["spec"]["ports"]}
        self.assertTrue(sm["spec"]["endpoints"])
        for ep in sm["spec"]["endpoints"]:
            self.assertLessEqual(set(ep), {"port", "path", "scheme", "interval", "scrapeTimeout"})
            self.assertIn(ep["port"], port_names)
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
    def test_kustomization_lists_every_file(self):
        kust = load_docs(K8S_BASE / "kustomization.yaml")[0]
        self.assertEqual(kust["kind"], "Kustomization")
        resources = kust["resources"]
        self.assertEqual(len(resources), len(set(resources)), "duplicate resources")
        on_disk = {p.name for p in K8S_BASE.glob("*.yaml")} - {"kustomization.yaml"}
        self.assertEqual(set(resources), on_disk)

    def test_kubectl_kustomize_builds_every_object(self):
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            self.skipTest("kubectl not installed; the resource list is checked by the test above")
        r = subprocess.run([kubectl, "kustomize", str(K8S_BASE)], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        import yaml
        built = [d for d in yaml.safe_load_all(r.stdout) if d]
        self.assertEqual(sorted((d["kind"], d["metadata"]["name"]) for d in built),
                         sorted((d["kind"], d["metadata"]["name"]) for _, _, d in k8s_docs()))
        images = {c["image"] for d in built if d["kind"] == "Deployment"
                  for c in d["spec"]["template"]["spec"]["containers"] + d["spec"]["template"]["spec"]["initContainers"]}
        tag = load_docs(K8S_BASE / "kustomization.yaml")[0]["images"][0]["newTag"]
        self.assertEqual(images, {f"flux2-server:{tag}"})


class DeploymentPolicyTest(unittest.TestCase):
    def setUp(self):
        self.dep = the_object("Deployment")
        self.pod = self.dep["spec"]["template"]["spec"]
        (self.server,) = [c for c in self.pod["containers"] if c["name"] == "server"]

    def test_one_gpu_per_pod(self):
        self.assertEqual(len(self.pod["containers"]), 1)
        self.assertEqual(self.server["resources"]["limits"]["nvidia.com/gpu"], 1)
        self.assertEqual(arg_value(self.server["args"], "--backend"), "cuda")

    def test_grpc_probes_on_the_named_health_services(self):
        port = int(arg_value(self.server["args"], "--port"))
        ports = {p["name"]: p["containerPort"] for p in self.server["ports"]}
        self.assertEqual(ports["grpc"], port)
        self.assertEqual(ports["metrics"], int(arg_value(self.server["args"], "--metrics-port")))
        for probe, service in (("startupProbe", "readiness"), ("livenessProbe", "liveness"),
                               ("readinessProbe", "readiness")):
            with self.subTest(probe=probe):
                self.assertEqual(self.server[probe]["grpc"], {"port": port, "service": service})
        startup = self.server["startupProbe"]
        # Weight loading + warm-up of FLUX.2-dev from a network volume: at least 10 minutes.
        self.assertGreaterEqual(startup["periodSeconds"] * startup["failureThreshold"], 600)
        self.assertGreaterEqual(self.server["livenessProbe"]["failureThreshold"], 3)

    def test_grace_period_covers_prestop_and_drain(self):
        pre_stop = self.server["lifecycle"]["preStop"]["exec"]["command"]
        self.assertEqual(pre_stop[0], "sleep")
        drain = float(arg_value(self.server["args"], "--drain-timeout-s"))
        grace = self.pod["terminationGracePeriodSeconds"]
        self.assertGreater(grace, int(pre_stop[1]) + drain,
                           "SIGKILL would cut the drain short: grace <= preStop sleep + --drain-timeout-s")
        self.assertGreaterEqual(drain, 300, "the drain must outlast the longest generation (minutes)")

    def test_restricted_security_context(self):
        psc = self.pod["securityContext"]
        self.assertTrue(psc["runAsNonRoot"])
        self.assertNotEqual(psc.get("runAsUser", 0), 0)
        self.assertEqual(psc["seccompProfile"], {"type": "RuntimeDefault"})
        self.assertFalse(self.pod.get("hostNetwork", False) or self.pod.get("hostPID", False))
        self.assertFalse(self.pod["automountServiceAccountToken"])
        for c in self.pod["containers"] + self.pod["initContainers"]:
            with self.subTest(container=c["name"]):
                sc = c["securityContext"]
                for key, want in RESTRICTED_CONTAINER.items():
                    self.assertEqual(sc.get(key), want, key)
                self.assertEqual(sc["capabilities"], {"drop": ["ALL"]})
                self.assertNotIn("privileged", sc)
                self.assertIn("limits", c["resources"])

    def test_weights_from_a_read_only_pvc_checked_before_start(self):
        volumes = {v["name"]: v for v in self.pod["volumes"]}
        mounts = {m["mountPath"]: m for m in self.server["volumeMounts"]}
        models = mounts["/models"]
        self.assertTrue(models["readOnly"])
        pvc = volumes[models["name"]]["persistentVolumeClaim"]
        self.assertTrue(pvc["readOnly"])
        self.assertEqual(pvc["claimName"], the_object("PersistentVolumeClaim")["metadata"]["name"])
        (init,) = self.pod["initContainers"]
        self.assertEqual(init["image"], self.server["image"])
        self.assertIn("sha256sum --check --strict", init["command"][-1])
        self.assertIn("cd /models", init["command"][-1])
        self.assertEqual({m["mountPath"]: m["readOnly"] for m in init["volumeMounts"]}, {"/models": True})
        # Everything the server may write goes to an emptyDir (read-only root filesystem).
        self.assertIn("emptyDir", volumes[mounts["/tmp"]["name"]])

    def test_selectors_agree(self):
        pod_labels = self.dep["spec"]["template"]["metadata"]["labels"]
        selectors = {"Deployment": self.dep["spec"]["selector"]["matchLabels"],
                     "Service": the_object("Service")["spec"]["selector"],
                     "PodDisruptionBudget": the_object("PodDisruptionBudget")["spec"]["selector"]["matchLabels"]}
        for kind, sel in selectors.items():
            with self.subTest(kind=kind):
                self.assertTrue(sel)
                for k, v in sel.items():
                    self.assertEqual(pod_labels.get(k), v)

    def test_headless_service_with_grpc_and_metrics_ports(self):
        svc = the_object("Service")
        self.assertEqual(svc["spec"]["clusterIP"], "None")
        container_ports = {p["name"] for p in self.server["ports"]}
        self.assertEqual({p["name"] for p in svc["spec"]["ports"]}, {"grpc", "metrics"})
        for p in svc["spec"]["ports"]:
            self.assertIn(p["targetPort"], container_ports)

    def test_hpa_scales_the_deployment_on_adapter_queue_metrics(self):
        hpa = the_object("HorizontalPodAutoscaler")
        self.assertEqual(hpa["apiVersion"], "autoscaling/v2")
        ref = hpa["spec"]["scaleTargetRef"]
        self.assertEqual((ref["kind"], ref["name"]), ("Deployment", self.dep["metadata"]["name"]))
        self.assertNotIn("replicas", self.dep["spec"], "the HPA owns the replica count")
        self.assertGreaterEqual(hpa["spec"]["minReplicas"], 2)
        served = {r["name"]["as"] for r in adapter_rules()}
        names = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]]
        self.assertTrue(names)
        for m in hpa["spec"]["metrics"]:
            self.assertEqual(m["type"], "Pods")
        self.assertIn("flux2_queue_wait_seconds", names)
        self.assertLessEqual(set(names), served, f"HPA metrics not served by {ADAPTER_FILE.name}")
        pdb = the_object("PodDisruptionBudget")
        self.assertLess(pdb["spec"]["maxUnavailable"], hpa["spec"]["minReplicas"])


if __name__ == "__main__":
    sys.argv[1:1] = ["-v"]
    unittest.main()
