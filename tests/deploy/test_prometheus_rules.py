#!/usr/bin/python3
# Prometheus rules: `promtool check rules`, the promtool unit tests in flux2-rules.test.yaml, and the PrometheusRule
# CRD of deploy/k8s/components/prometheusrule carrying exactly the same groups as deploy/prometheus/flux2-rules.yaml.
import subprocess
import sys
import unittest

from deploy_common import DEPLOY, PROMETHEUSRULE_FILE, PYTHON, REPO, RULES_FILE, load_docs, rules, the_object, tool


class PrometheusRulesTest(unittest.TestCase):
    def test_promtool_check_rules(self):
        for path in (RULES_FILE,):
            r = subprocess.run([tool("promtool"), "check", "rules", str(path)], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn(f"SUCCESS: {len(rules())} rules found", r.stdout)

    def test_promtool_unit_tests(self):
        r = subprocess.run([tool("promtool"), "test", "rules", "flux2-rules.test.yaml"],
                           cwd=REPO / "tests" / "deploy", capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("SUCCESS", r.stdout)

    def test_every_alert_has_a_unit_test(self):
        tests = load_docs(REPO / "tests" / "deploy" / "flux2-rules.test.yaml")[0]["tests"]
        tested = {t["alertname"] for group in tests for t in group.get("alert_rule_test", [])
                  if t.get("exp_alerts")}
        alerts = {r["alert"] for r in rules() if "alert" in r}
        self.assertEqual(alerts - tested, set(), "alerts never shown to fire in flux2-rules.test.yaml")

    def test_every_alert_links_its_runbook_section(self):
        readme = (DEPLOY / "README.md").read_text()
        for rule in rules():
            if "alert" not in rule:
                continue
            with self.subTest(alert=rule["alert"]):
                url = rule["annotations"].get("runbook_url", "")
                self.assertEqual(url, f"deploy/README.md#runbook-{rule['alert'].lower()}")
                anchor = url.split("#", 1)[1]
                self.assertIn(f'<a id="{anchor}"></a>\n### {rule["alert"]}\n', readme)

    def test_prometheusrule_crd_is_rendered_from_the_rules_file(self):
        r = subprocess.run([PYTHON, str(DEPLOY / "prometheus" / "render_prometheusrule.py"), "--check"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"{PROMETHEUSRULE_FILE.name} matches", r.stdout)
        crd = the_object("PrometheusRule")
        self.assertEqual(crd["spec"]["groups"], load_docs(RULES_FILE)[0]["groups"])
        kust = load_docs(PROMETHEUSRULE_FILE.parent / "kustomization.yaml")[0]
        self.assertEqual(kust["kind"], "Component")
        self.assertIn(PROMETHEUSRULE_FILE.name, kust["resources"])

    def test_crd_rules_pass_promtool_too(self):
        # The CRD's spec is what prometheus-operator hands Prometheus: it must load as a rules file.
        import tempfile
        import yaml
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            yaml.safe_dump(the_object("PrometheusRule")["spec"], f)
            f.flush()
            r = subprocess.run([tool("promtool"), "check", "rules", f.name], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)


if __name__ == "__main__":
    sys.argv[1:1] = ["-v"]
    unittest.main()
