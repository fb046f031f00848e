#!/usr/bin/python3
# Every shared library the built flux2_server loads (ldd, and dlopen in its sources) will exist in the runtime image:
# Debian libraries come from the packages `deploy/install_deps.sh --runtime` installs (with their dependencies), CUDA
# ones from the Dockerfile's list, the driver's (libcuda, NVML) from the host through the NVIDIA container toolkit.
import fnmatch
import os
import re
import subprocess
import sys
import unittest

from deploy_common import REPO
from server_fixture import server_binary

# Loaded by the kernel / dynamic loader, or injected from the host driver by the NVIDIA container toolkit
# (NVIDIA_DRIVER_CAPABILITIES compute: libcuda; utility: NVML).
NOT_PACKAGED = {"linux-vdso.so.1", "libcuda.so.1", "libnvidia-ml.so.1"}


def ldd(binary) -> dict[str, str | None]:
    """soname -> resolved path (None when not found)."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    libs = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) => (not found|(\S+) \(0x[0-9a-f]+\))", line)
        if m:
            libs[m.group(1)] = m.group(3)
            continue
        m = re.match(r"\s*(\S+) \(0x[0-9a-f]+\)", line)
        if m:
            libs[os.path.basename(m.group(1))] = m.group(1)
    return libs


def runtime_packages() -> list[str]:
    text = (REPO / "deploy" / "install_deps.sh").read_text()
    m = re.search(r"runtime_packages=\(([^)]*)\)", text)
    assert m, "deploy/install_deps.sh has no runtime_packages=(...) array"
    return m.group(1).split()


def dockerfile_cuda_sonames() -> list[str]:
    """The cuda-runtime stage's list of CUDA libraries copied into the image (the first `for soname in`)."""
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    m = re.search(r"for soname in (.*?); do", text)
    assert m, "Dockerfile: no `for soname in ...; do` list in the cuda-runtime stage"
    return [w.strip("'\"") for w in m.group(1).split()]


def dockerfile_dlopen_checks() -> list[str]:
    """The runtime stage's list of dlopen-ed libraries the build checks ldconfig finds."""
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    m = re.search(r"for soname in ([^;]*); do\s+ldconfig -p", text)
    assert m, "Dockerfile: no `for soname in ...; do ldconfig -p ...` check in the runtime stage"
    return m.group(1).split()


def dlopened_sonames() -> set[str]:
    """Versioned sonames the server's sources pass to dlopen (unversioned `libX.so` names are dev-tree fallbacks)."""
    found = set()
    for path in [*(REPO / "server").rglob("*.cc"), *(REPO / "kernels").rglob("*.cc"), *(REPO / "model").rglob("*.cc")]:
        text = path.read_text()
        if "dlopen(" in text:
            found |= set(re.findall(r'"(lib[\w+-]+\.so\.[\d.]+)"', text))
    return found


def installed_dependency_closure(roots: list[str]) -> set[str]:
    """Packages apt installs for `roots`: Depends and Pre-Depends, recursively, resolved against what is
    installed here (the first installed alternative; virtual packages through Provides)."""
    out = subprocess.run(["dpkg-query", "-W", "-f", "${Package}\t${Status}\t${Depends}, ${Pre-Depends}\t${Provides}\n"],
                         capture_output=True, text=True, check=True).stdout
    deps, providers = {}, {}
    for line in out.splitlines():
        pkg, status, dep, provides = (line.split("\t") + ["", "", ""])[:4]
        if not status.endswith("installed") or "not-installed" in status:
            continue
        deps[pkg] = dep
        for p in provides.split(","):
            if p.strip():
                providers.setdefault(re.sub(r"[ (:].*", "", p.strip()), []).append(pkg)

    def resolve(name):
        name = re.sub(r":\w+$", "", name)
        if name in deps:
            return name
        return next(iter(providers.get(name, [])), None)

    seen, todo = set(), list(roots)
    while todo:
        pkg = resolve(todo.pop())
        if pkg is None or pkg in seen:
            continue
        seen.add(pkg)
        for group in deps[pkg].split(","):
            alternatives = [re.sub(r"\s*\(.*?\)|\s*\[.*?\]", "", a).strip() for a in group.split("|")]
            chosen = next((a for a in alternatives if a and resolve(a)), None)
            if chosen:
                todo.append(chosen)
    return seen


def owning_package(path: str) -> str | None:
    real = os.path.realpath(path)
    candidates = [real, path]
    for p in list(candidates):
        candidates.append(p[4:] if p.startswith("/usr/") else "/usr" + p)
    for c in candidates:
        r = subprocess.run(["dpkg", "-S", c], capture_output=True, text=True)
        if r.returncode == 0:
            return r.stdout.split(":")[0].split(",")[0].strip()
    return None


class RuntimeLibrariesTest(unittest.TestCase):
    def test_runtime_image_provides_every_loaded_library(self):
        libs = ldd(server_binary())
        self.assertIn("libgrpc++.so.1.51", libs)
        closure = installed_dependency_closure(runtime_packages())
        cuda_patterns = dockerfile_cuda_sonames()
        for soname, path in sorted(libs.items()):
            if soname in NOT_PACKAGED or soname.startswith("ld-linux"):
                continue
            with self.subTest(library=soname):
                self.assertIsNotNone(path, f"{soname} is not found here either")
                if "/cuda" in path:
                    self.assertTrue(any(fnmatch.fnmatchcase(soname, p) for p in cuda_patterns),
                                    f"{soname} ({path}) is not copied by the Dockerfile's cuda-runtime stage")
                    continue
                pkg = owning_package(path)
                self.assertIsNotNone(pkg, f"{path} belongs to no Debian package")
                self.assertIn(pkg, closure, f"{soname} comes from {pkg}, which `install_deps.sh --runtime` "
                                            f"({' '.join(runtime_packages())}) does not install")

    def test_dlopened_cuda_libraries_are_shipped(self):
        # Loaded with dlopen, so invisible to ldd. Measured from /proc/PID/maps of flux2_server (CUDA 13.0.2,
        # cuDNN 9.14, H200) after GenerateImage and GenerateImageStream requests: cuBLASLt (our dlopen),
        # cuDNN's sub-libraries (its shim loads them on demand) and NVRTC for its runtime-compiled engines.
        loaded = ["libcublasLt.so.13", "libnvrtc.so.13", "libnvrtc-builtins.so.13.0", "libcudnn_graph.so.9",
                  "libcudnn_ops.so.9", "libcudnn_cnn.so.9", "libcudnn_heuristic.so.9",
                  "libcudnn_engines_precompiled.so.9", "libcudnn_engines_runtime_compiled.so.9"]
        patterns = dockerfile_cuda_sonames()
        for soname in loaded:
            with self.subTest(library=soname):
                self.assertTrue(any(fnmatch.fnmatchcase(soname, p) for p in patterns))
                self.assertIn(soname, dockerfile_dlopen_checks(), "the image build checks ldconfig finds it")

    def test_every_dlopen_in_the_sources_is_shipped_or_from_the_driver(self):
        sonames = dlopened_sonames()
        self.assertIn("libcublasLt.so.13", sonames)
        patterns, checks = dockerfile_cuda_sonames(), dockerfile_dlopen_checks()
        for soname in sorted(sonames):
            with self.subTest(library=soname):
                if soname in NOT_PACKAGED:
                    continue
                self.assertTrue(any(fnmatch.fnmatchcase(soname, p) for p in patterns),
                                f"{soname} is dlopen-ed but not copied by the Dockerfile's cuda-runtime stage")
                self.assertIn(soname, checks)


if __name__ == "__main__":
    sys.argv[1:1] = ["-v"]
    unittest.main()
