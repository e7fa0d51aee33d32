# basal — one command per job. `make test` works on a fresh machine: it creates .venv and installs everything.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv test test-fast test-all determinism gpu-wheels gpu-image-check bench lint serve clean lock check-install \
	image-base image image-check image-lint

venv: $(STAMP)

# torch is installed first and by exact version, so that no dependency can pull a different build. On a Linux
# machine without a GPU, `make venv TORCH_INDEX_URL=<PyTorch's CPU wheel index>` takes the CPU-only build instead
# of the default (multi-GB) CUDA one; see docs/install.md, "Linux without a GPU".
# Everything else comes at the exact versions of the lock (lock/README.md): the CPU build's, Python 3.11.
TORCH_INDEX_URL ?=
TORCH_PIP_ARGS := $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL),)
LOCK ?= lock/linux-cpu.txt

$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH_PIP_ARGS) torch==2.13.0
	$(PY) -m pip install -q -c $(LOCK) -e '.[dev]'
	$(PY) -c "from basal.backends.cuda.cpu import cpu_kernels; print('compiled CPU kernels:', cpu_kernels.status())"
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -q -m "not slow"

# the development loop: everything but the determinism suite (run `make determinism` before you push)
test-fast: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -q -m "not slow" --ignore=tests/determinism

test-all: $(STAMP) check-install
	$(PY) -m pytest -q

# the cross-backend determinism suite alone, with a one-line verdict per backend x dtype
determinism: $(STAMP)
	$(PY) -m pytest -q tests/determinism

# what `basal serve` needs beyond the GPU machine's image (tests/gpu/serve-wheels.txt), as Python 3.12 wheels in
# .whl/ (about 9 MB, git-ignored): a device run carries them (docs/gpu-path.md §8.2)
WHEEL_TAGS := --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
	--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64
gpu-wheels:
	grep -v '^#' tests/gpu/serve-wheels.txt | xargs $(PYTHON) -m pip download -q --no-deps --only-binary=:all: \
		$(WHEEL_TAGS) -d .whl

# the GPU path's CPU checks on the GPU image's versions (tests/gpu/image-versions.txt: Python 3.12, torch 2.11,
# Triton 3.6, numpy 2.5) in a venv of their own: the gpu_check dry run with only the image's imports (and
# `basal serve` from the carried wheels, as on the device), the kernels under the interpreter and the host-side
# tests. Not in `make test`: PyPI's torch 2.11 is a CUDA build (about 4.7 GB with its libraries). IMAGE_ALSO: what
# the image has that basal serve uses (unpinned: the image's versions are not all known); pytest and msgspec are
# for the test suite's conftest (the dry run refuses msgspec), hypothesis for the host-side property tests.
IMAGE_PYTHON ?= python3.12
IMAGE_VENV   ?= .venv-image
IMAGE_ALSO   := anyio click httpx multidict rich h11 uvloop
IMAGE_SITE    = $(abspath $(IMAGE_VENV))/site
gpu-image-check: gpu-wheels
	@test -x $(IMAGE_VENV)/bin/python || $(IMAGE_PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 12)' \
		|| { echo "gpu-image-check needs the image's Python 3.12: make gpu-image-check IMAGE_PYTHON=/path/to/python3.12" \
		"(pyenv: IMAGE_PYTHON=\$$(pyenv root)/versions/3.12.1/bin/python)"; exit 2; }
	test -x $(IMAGE_VENV)/bin/python || $(IMAGE_PYTHON) -m venv $(IMAGE_VENV)
	$(IMAGE_VENV)/bin/python -m pip install -q -r tests/gpu/image-versions.txt $(IMAGE_ALSO) pytest msgspec hypothesis
	rm -rf $(IMAGE_SITE) $(IMAGE_VENV)/dry-run
	$(IMAGE_VENV)/bin/python -m pip install -q --no-index --no-deps --no-compile --target $(IMAGE_SITE) .whl/*.whl
	PYTHONPATH=$(CURDIR):$(IMAGE_SITE) $(IMAGE_VENV)/bin/python tests/gpu/image_guard.py bench/checks/gpu_check.py \
		--cpu-dry-run --out $(IMAGE_VENV)/dry-run
	TRITON_INTERPRET=1 PYTHONPATH=$(CURDIR) $(IMAGE_VENV)/bin/python -m pytest -q -p no:cacheprovider -m "not slow" \
		tests/gpu/interpreter
	PYTHONPATH=$(CURDIR) $(IMAGE_VENV)/bin/python -m pytest -q -p no:cacheprovider -m "not slow and not background" \
		tests/gpu/test_host_side.py tests/gpu/test_pacing.py tests/gpu/test_sm90_compile.py

# every benchmark suite, CPU-sized (mini shapes cut to 2 layers; about 15 min on 2 cores), tables and plots in
# bench/results; progress per suite on standard error
bench: $(STAMP)
	$(VENV)/bin/basal bench --plot

# serves the built-in demo model on 127.0.0.1:8000 (synthetic: its answers carry no meaning) from a venv of its own
# that holds what serving needs and nothing else (basal's runtime dependencies at the lock's versions, no dev stack),
# with pip's progress shown; editable, so it serves the checkout as it is; `make test`'s .venv is separate
SERVE_VENV  ?= .venv-serve
SERVE_STAMP := $(SERVE_VENV)/.installed

$(SERVE_STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(SERVE_VENV)
	$(SERVE_VENV)/bin/python -m pip install --progress-bar on $(TORCH_PIP_ARGS) torch==2.13.0
	$(SERVE_VENV)/bin/python -m pip install --progress-bar on -c $(LOCK) -e .
	touch $(SERVE_STAMP)

serve: $(SERVE_STAMP)
	$(SERVE_VENV)/bin/basal serve $(SERVE_ARGS)

# --- packaging (docs/install.md) ---

# where the CPU build of torch's wheel lies for the Linux CPU target: pip's configured find-links (this machine's
# local disk), else TORCH_INDEX_URL (PyTorch's CPU index)
TORCH_FIND_LINKS ?= $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null)
UV := UV_PYTHON_DOWNLOADS=never $(VENV)/bin/uv
CPU_TORCH_ARGS = $(if $(TORCH_FIND_LINKS),--torch-find-links $(TORCH_FIND_LINKS),$(if $(TORCH_INDEX_URL),--torch-index \
	$(TORCH_INDEX_URL),))

# resolves the dependency set of each install target from the registry's metadata, installing nothing (seconds),
# then the negative control: the pins basal had before (lock/negative/) must conflict with PyPI's CUDA torch
check-install: $(STAMP)
	$(PY) deploy/check_install.py $(CPU_TORCH_ARGS)
	$(PY) deploy/check_install.py --pyproject lock/negative/pyproject.toml --expect-conflict linux-cuda-2.13

# rewrites the locks from pyproject.toml, keeping every locked version that still fits (uv prefers them)
lock: $(STAMP)
	$(UV) pip compile pyproject.toml lock/linux-cpu.in --extra dev --python-version 3.11 \
		--python-platform x86_64-manylinux_2_36 $(if $(TORCH_FIND_LINKS),--find-links $(TORCH_FIND_LINKS),--index \
		$(TORCH_INDEX_URL) --index-strategy unsafe-best-match) --no-config -o lock/linux-cpu.txt \
		--custom-compile-command "make lock"
	$(UV) pip compile pyproject.toml lock/linux-cuda.in --extra cuda --extra hub --python-version 3.12 \
		--python-platform x86_64-manylinux_2_39 --no-config -o lock/linux-cuda.txt --custom-compile-command "make lock"

# --- the container image (Dockerfile, docs/install.md); needs a running Docker daemon ---

DOCKER    ?= docker
IMAGE     ?= basal-bitwise
IMAGE_TAG ?= $(shell sed -n 's/^__version__ = "\(.*\)"$$/\1/p' basal/__init__.py)
# BASE: the cpu target's base image instead of the public one. Where no container registry is reachable (this
# project's machines), `make image-base` builds basal-base:bookworm from the Debian mirror: make image-check
# BASE=basal-base:bookworm. It carries the host's CA bundle, which pip is then told to use; the host's index too.
BASE        ?=
HOST_INDEX  := $(shell $(PYTHON) -m pip config get global.index-url 2>/dev/null)
PIP_ARGS    ?= $(if $(BASE),--cert /etc/ssl/certs/ca-certificates.crt,)$(if $(HOST_INDEX), --index-url $(HOST_INDEX),)
CPU_WHEEL    = $(firstword $(wildcard $(TORCH_FIND_LINKS)/torch-2.13.0+cpu-*.whl))
IMAGE_ARGS  ?=
# the classic builder where buildx is missing (Debian's docker.io); --network host: no bridge needed
DOCKER_BUILD = $(if $(shell $(DOCKER) buildx version 2>/dev/null),,DOCKER_BUILDKIT=0 )$(DOCKER) build --network host \
	$(if $(BASE),--build-arg BASE=$(BASE) --build-arg BUILD_BASE=$(BASE),) \
	$(if $(PIP_ARGS),--build-arg PIP_ARGS="$(PIP_ARGS)",) $(if $(CPU_WHEEL),--build-arg TORCH_INDEX_URL=,) $(IMAGE_ARGS)

image-base:
	deploy/docker/base_image.sh basal-base:bookworm

# the cpu target; the CPU build of torch's wheel goes into the build from pip's find-links where there is one
image:
	$(if $(CPU_WHEEL),cp -u $(CPU_WHEEL) deploy/docker/wheels/,)
	$(DOCKER_BUILD) --target cpu -t $(IMAGE):$(IMAGE_TAG)-cpu .

# runs the cpu image: /health, a decision, kernels, HEALTHCHECK, non-root, drain on docker stop; then the negative
# control (root, SIGKILL), whose faults the same checks must see. About 2 min with the image built.
image-check: image
	$(PYTHON) deploy/image_check.py $(IMAGE):$(IMAGE_TAG)-cpu
	$(PYTHON) deploy/image_check.py $(IMAGE):$(IMAGE_TAG)-cpu --negative

# hadolint on the Dockerfile (both targets), and the cuda target's stage that needs no CUDA base (basal's wheel)
image-lint: $(STAMP)
	$(VENV)/bin/hadolint Dockerfile
	$(DOCKER_BUILD) --target wheel -t $(IMAGE):$(IMAGE_TAG)-wheel .

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

clean:
	rm -rf $(VENV) $(SERVE_VENV) .pytest_cache .ruff_cache .hypothesis
