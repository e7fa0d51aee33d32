# basal's container image, two targets (docs/install.md):
#   docker build --target cpu  -t basal-bitwise:0.1.0-cpu  .     # torch's CPU build, Python 3.11 (lock/linux-cpu.txt)
#   docker build --target cuda -t basal-bitwise:0.1.0-cuda .     # PyPI's CUDA torch + Triton, Python 3.12 (lock/linux-cuda.txt)
# Build arguments:
#   BASE             the cpu target's base: Debian-like, with python3 3.11 that can make a venv (lock/linux-cpu.txt)
#   CUDA_BASE        the cuda target's base: Debian-like, with apt packages python3 3.12 (lock/linux-cuda.txt)
#   BUILD_BASE       the stage that builds basal's wheel (pure Python; any Debian-like image with python3 and venv)
#   EXTRAS           basal's extras beside the target's own (default hub; hub,ray for a Ray Serve image)
#   PIP_ARGS         options for every pip install (an index, a certificate, ...)
#   TORCH_INDEX_URL  the index of torch's CPU build (cpu target); wheels in deploy/docker/wheels/ are used first
ARG BASE="python:3.11-slim-bookworm"
ARG CUDA_BASE="nvidia/cuda:13.0.0-base-ubuntu24.04"
ARG BUILD_BASE="python:3.11-slim-bookworm"

# ---------------------------------------------------------------- basal's wheel (both targets)
FROM ${BUILD_BASE} AS wheel
ARG PIP_ARGS=""
WORKDIR /src
COPY pyproject.toml README.md LICENSE NOTICE ./
COPY basal/ basal/
# hadolint ignore=SC2086
RUN python3 -m venv /tmp/build \
    && /tmp/build/bin/pip install $PIP_ARGS --no-cache-dir -q --upgrade pip \
    && /tmp/build/bin/pip wheel $PIP_ARGS --no-cache-dir -q --no-deps -w /wheel .

# ---------------------------------------------------------------- the cpu target
# (stages stay in target order: Docker's classic builder builds every stage above the target it is asked for)
FROM ${BASE} AS cpu-os
ARG DEBIAN_FRONTEND=noninteractive
COPY deploy/docker/image.sh /usr/local/lib/basal/image.sh
# gcc + libc6-dev: basal compiles its CPU kernels (at build time, and again at run time on another CPU model);
# tini: the init process (signals, zombies)
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev tini ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && /usr/local/lib/basal/image.sh user

# the venv by the steps both targets share (deploy/docker/image.sh)
FROM cpu-os AS cpu-venv
ARG PIP_ARGS=""
ARG TORCH_INDEX_URL="https://download.pytorch.org/whl/cpu"
ARG EXTRAS="hub"
COPY lock/linux-cpu.txt /tmp/lock.txt
COPY deploy/docker/wheels/ /tmp/wheels/
# torch's CPU build: from the wheels given to the build, else its index
# hadolint ignore=SC2086
RUN /usr/local/lib/basal/image.sh torch $PIP_ARGS --find-links /tmp/wheels \
       ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"}
COPY --from=wheel /wheel/ /tmp/wheel/
# hadolint ignore=SC2086
RUN /usr/local/lib/basal/image.sh basal "$EXTRAS" $PIP_ARGS

FROM cpu-os AS cpu
COPY --from=cpu-venv /opt/venv /opt/venv
# /data: basal's cache (demo model, compiled kernels, probe tables), Hugging Face downloads, Triton's cache
ENV PATH=/opt/venv/bin:$PATH \
    HOME=/data \
    BASAL_HOME=/data/basal \
    HF_HOME=/data/huggingface \
    TRITON_CACHE_DIR=/data/triton \
    BASAL_ADDR=0.0.0.0:8000 \
    PYTHONUNBUFFERED=1
USER 10001:10001
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# one decision on the demo model now: it writes the demo model and compiles the CPU kernels for this CPU into
# /data, so a first start on this machine waits for neither (a new named volume starts with them)
RUN echo '{"model": "jev-latest", "state": "image build", "questions": {"q": {"type": "noul", "instructions": "Is this a build?"}}}' | basal decide \
    && ls /data/basal/native/cpu_kernels-*.so
VOLUME /data
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=10m --retries=3 CMD ["python3", "-c", "import os, urllib.request; port = os.environ.get('BASAL_ADDR', ':8000').rpartition(':')[2]; urllib.request.urlopen(f'http://127.0.0.1:{port}/health', timeout=4)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["tini", "--", "basal", "serve"]

# ---------------------------------------------------------------- the cuda target
FROM ${CUDA_BASE} AS cuda-os
ARG DEBIAN_FRONTEND=noninteractive
COPY deploy/docker/image.sh /usr/local/lib/basal/image.sh
# the CUDA libraries come with PyPI's torch (nvidia-* wheels); the driver comes from the host (NVIDIA's container
# toolkit). python3-dev + gcc: Triton compiles its kernel launcher at run time; tini: the init process
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc libc6-dev tini ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && /usr/local/lib/basal/image.sh user

# the venv by the steps both targets share (deploy/docker/image.sh)
FROM cuda-os AS cuda-venv
ARG PIP_ARGS=""
ARG EXTRAS="hub"
COPY lock/linux-cuda.txt /tmp/lock.txt
# PyPI's CUDA torch (with its nvidia-* wheels and Triton)
# hadolint ignore=SC2086
RUN /usr/local/lib/basal/image.sh torch $PIP_ARGS
COPY --from=wheel /wheel/ /tmp/wheel/
# hadolint ignore=SC2086
RUN /usr/local/lib/basal/image.sh basal "cuda${EXTRAS:+,$EXTRAS}" $PIP_ARGS

FROM cuda-os AS cuda
COPY --from=cuda-venv /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    HOME=/data \
    BASAL_HOME=/data/basal \
    HF_HOME=/data/huggingface \
    TRITON_CACHE_DIR=/data/triton \
    BASAL_ADDR=0.0.0.0:8000 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
VOLUME /data
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=10m --retries=3 CMD ["python3", "-c", "import os, urllib.request; port = os.environ.get('BASAL_ADDR', ':8000').rpartition(':')[2]; urllib.request.urlopen(f'http://127.0.0.1:{port}/health', timeout=4)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["tini", "--", "basal", "serve"]
