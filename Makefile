# Developer entry points.
#
#   make test                                  both ends of the supported jax range: build
#                                              jaxcc into .venv (Python 3.11: jax 0.10), run
#                                              tests/ and `make sanitize`; then the same
#                                              tests in .venv-newest (Python >= 3.12: the
#                                              newest jax 0.12) when such a Python is on PATH
#                                              (CI=true requires one)
#   make test PYTEST_ARGS=tests/test_reduce.py  a subset (any pytest arguments;
#                                              tests/ is run unless they name tests) on
#                                              both, without `make sanitize`
#   make test NEWEST_PYTHON=                   the .venv leg only
#   make sanitize                              the CPU module with AddressSanitizer and
#                                              UndefinedBehaviorSanitizer, run on SANITIZE_TESTS
#   make sanitize PYTEST_ARGS=tests/test_reduce.py  another subset, sanitized
#   make demo                                  run examples/demo.py
#   make install                               only (re)build and install jaxcc
#
# The CUDA module (with nvcc) is built in .venv; the newest leg builds the CPU
# module only (JAXCC_ENABLE_CUDA=OFF): compiling the CUDA sources once a run
# is enough, and takes minutes.
#
# .venv is created with python3.11 (else python3, which must be >= 3.11), and
# .venv-newest with Python 3.12 (else 3.13) when PYTHON is older. jaxcc
# is installed editable and without build isolation, so its native modules are
# compiled against the jaxlib that runs them; they are rebuilt only when a
# native source, CMakeLists.txt, pyproject.toml or the installed jaxlib changes.
#
# `make sanitize` builds _jaxcc_cpu with -fsanitize=address,undefined (GCC) into
# build/sanitize, with CMake directly (the installed module is untouched), when
# a native source, CMakeLists.txt or jaxlib changed, and runs the codec, native
# executor, multi-process, HMAC and TCP fuzz tests with it (JAXCC_NATIVE_DIR)
# under the sanitizer runtimes; the worker processes of the multi-process tests
# inherit them. Any report aborts its process and fails the target, also where
# a test expected that process to fail; the reports are kept in
# build/sanitize/reports and printed. ASan's allocator makes XLA's compiles about
# twice as slow, so XLA compiles without LLVM optimisation there (the subset's
# bit-for-bit comparisons with XLA hold at that level too) and the multi-process
# jobs get 3 times their time limit. It takes about 5 minutes on 2 cores.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
# The newest leg's interpreter: jax >= 0.11 needs Python >= 3.12. None when PYTHON
# is one already (then .venv has the newest jax).
PYTHON_IS_NEWEST := $(shell $(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 12))' \
  2>/dev/null && echo yes)
# The first of python3.12, python3.13 (on PATH, or a pyenv version not made global)
# that runs.
ifndef NEWEST_PYTHON
NEWEST_PYTHON := $(if $(PYTHON_IS_NEWEST),,$(shell for p in python3.12 python3.13 \
  $$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.1[23]*/bin/python3 2>/dev/null); do \
  "$$p" -c '' 2>/dev/null && command -v "$$p" && break; done))
endif
PY := $(VENV)/bin/python
# Prints pyproject.toml's build requirements but jax (its pin is for isolated wheel
# builds; here the module is built against the jax it runs with), runtime
# dependencies and test and bench extras (not minilm nor baselines: they bring
# torch) as shell words.
PRINT_DEPS = $(PY) -c 'import shlex, tomllib; p = tomllib.load(open("pyproject.toml", "rb")); \
  e = p["project"]["optional-dependencies"]; \
  build = [r for r in p["build-system"]["requires"] if not r.startswith("jax")]; \
  print(shlex.join(build + p["project"]["dependencies"] + e["test"] + e["bench"]))'
CMAKE_MIN := 3.18
PYTEST_ARGS ?=
TEST_PATHS := $(if $(filter tests%,$(PYTEST_ARGS)),,tests)
# The whole suite runs in two parts: the tests that share the CPU well, on every core
# (pytest-xdist, at most 8 workers), then the `multiprocess` ones alone, whose processes and
# emulated links would time out or measure wrong on cores that other tests hold. Both parts
# run even if the first fails. A subset (PYTEST_ARGS) runs as it is, in one part.
PARALLEL := -n auto --maxprocesses 8
TWO_PARTS = $(1) -m "not multiprocess" $(PARALLEL) $(2) || status=$$?; \
  $(1) -m multiprocess $(2) || status=$$?

NATIVE_SOURCES := $(shell find xla_ffi -type f \( -name '*.h' -o -name '*.cc' -o -name '*.cu' \))
JAXLIB_VERSION := $(wildcard $(VENV)/lib/python3*/site-packages/jaxlib/version.py)
DEPS_STAMP := $(VENV)/.jaxcc-deps
INSTALL_STAMP := $(VENV)/.jaxcc-installed
# With nvcc, nccl.h for the CUDA module's Nccl transport: fetched once from the
# nvidia-nccl-cu13 wheel into build/nccl/include (CMake looks there). Only the
# header is kept; libnccl.so.2 is loaded at run time. A failed fetch (offline)
# builds the CUDA module without the transport; `rm -rf build/nccl` retries.
NVCC := $(if $(filter OFF off 0,$(JAXCC_ENABLE_CUDA)),,$(or $(CUDACXX),$(shell command -v nvcc 2>/dev/null)))
NCCL_STAMP := $(if $(NVCC),build/nccl/.fetched)

SANITIZE_DIR := build/sanitize
SANITIZE_STAMP := $(SANITIZE_DIR)/.built
SANITIZE_REPORTS := $(SANITIZE_DIR)/reports
SANITIZE_TESTS := tests/codec tests/test_native_executor.py tests/test_multiprocess.py \
  $(wildcard tests/test_hmac.py tests/test_tcp_fuzz.py)
SANITIZE_PATHS := $(if $(filter tests%,$(PYTEST_ARGS)),,$(SANITIZE_TESTS))
CMAKE = $(or $(wildcard $(VENV)/bin/cmake),cmake)
# The runtimes the module links, ASan's first. Python links no libstdc++: unless
# it is preloaded too, ASan finds no __cxa_throw to intercept and jaxlib's first
# C++ exception fails an ASan CHECK.
SANITIZE_PRELOAD = $(shell ldd $(SANITIZE_DIR)/_jaxcc_cpu*.so | \
  awk '/libasan/ {a = $$3} /libstdc\+\+/ {s = $$3} END {print a, s}')
SANITIZE_ENV = JAXCC_NATIVE_DIR=$(CURDIR)/$(SANITIZE_DIR) LD_PRELOAD="$(SANITIZE_PRELOAD)" \
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:log_path=$(CURDIR)/$(SANITIZE_REPORTS)/asan \
  UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1:print_stacktrace=1:log_path=$(CURDIR)/$(SANITIZE_REPORTS)/ubsan \
  XLA_FLAGS="--xla_backend_optimization_level=0 $(XLA_FLAGS)" JAXCC_TEST_TIMEOUT_SCALE=3

.PHONY: all install test sanitize demo clean

all: install

install: $(INSTALL_STAMP)

test: $(INSTALL_STAMP)
	@$(PY) -c 'import jax, sys; print(f"== Python {sys.version.split()[0]}, jax {jax.__version__} ($(VENV))")'
	$(if $(PYTEST_ARGS),$(PY) -m pytest -q $(PYTEST_ARGS) $(TEST_PATHS),\
	  $(call TWO_PARTS,$(PY) -m pytest -q,tests); exit $${status:-0})
	$(if $(PYTEST_ARGS)$(NO_SANITIZE),,$(MAKE) sanitize)
ifneq ($(NEWEST_PYTHON),)
	$(MAKE) test VENV=.venv-newest PYTHON=$(NEWEST_PYTHON) NEWEST_PYTHON= NO_SANITIZE=1 \
	  JAXCC_ENABLE_CUDA=OFF
else ifeq ($(CI)$(PYTHON_IS_NEWEST)$(NO_SANITIZE),true)
	@echo "error: CI tests the newest jax too, and no python3.12 or python3.13 is on PATH" >&2; exit 1
endif

# Leaks are not reported: the interpreter and jaxlib keep memory until exit.
sanitize: $(INSTALL_STAMP) $(SANITIZE_STAMP)
	@rm -rf $(SANITIZE_REPORTS) && mkdir -p $(SANITIZE_REPORTS)
	$(if $(PYTEST_ARGS),$(SANITIZE_ENV) $(PY) -m pytest -x -q $(PYTEST_ARGS) $(SANITIZE_PATHS) \
	  || status=$$?,$(call TWO_PARTS,$(SANITIZE_ENV) $(PY) -m pytest -x -q,$(SANITIZE_PATHS))); \
	if [ -n "$$(ls $(SANITIZE_REPORTS))" ]; then \
	  cat $(SANITIZE_REPORTS)/*; echo "error: sanitizer reports, kept in $(SANITIZE_REPORTS)" >&2; \
	  exit 1; \
	fi; exit $${status:-0}

demo: $(INSTALL_STAMP)
	$(PY) examples/demo.py

clean:
	rm -rf build $(INSTALL_STAMP)

$(PY):
	@test -n "$(PYTHON)" || { echo "error: neither python3.11 nor python3 is on PATH" >&2; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else \
	  "error: jaxcc needs Python >= 3.11, $(PYTHON) is " + sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)

# The dependencies of pyproject.toml above and ninja; a cmake from PyPI if the
# system has none (or one older than CMAKE_MIN).
$(DEPS_STAMP): Makefile pyproject.toml | $(PY)
	deps=$$($(PRINT_DEPS)) && eval "$(PY) -m pip install -q $$deps ninja"
	@v=$$(cmake --version 2>/dev/null | sed -n 's/^cmake version \([0-9.]*\).*/\1/p'); \
	oldest=$$(printf '%s\n' $(CMAKE_MIN) "$$v" | sort -V | head -n1); \
	if [ -z "$$v" ] || [ "$$oldest" != $(CMAKE_MIN) ]; then \
	  echo "no cmake >= $(CMAKE_MIN) on PATH; installing it from PyPI"; \
	  $(PY) -m pip install -q "cmake>=$(CMAKE_MIN)"; \
	fi
	touch $@

build/nccl/.fetched: | $(DEPS_STAMP)
	@mkdir -p build/nccl/include
	@if $(PY) -m pip download -q --no-deps nvidia-nccl-cu13 -d build/nccl/wheel && \
	  unzip -q -o -j build/nccl/wheel/nvidia_nccl_cu13-*.whl 'nvidia/nccl/include/nccl.h' \
	    -d build/nccl/include; then \
	  echo "nccl.h fetched into build/nccl/include"; \
	else \
	  echo "warning: could not fetch nccl.h; the CUDA module is built without the Nccl transport"; \
	fi
	@rm -rf build/nccl/wheel
	@touch $@

$(SANITIZE_STAMP): $(DEPS_STAMP) $(NATIVE_SOURCES) CMakeLists.txt $(JAXLIB_VERSION)
	$(CMAKE) -S . -B $(SANITIZE_DIR) -G Ninja -DCMAKE_MAKE_PROGRAM=$(CURDIR)/$(VENV)/bin/ninja \
	  -DPython_EXECUTABLE=$(CURDIR)/$(PY) -DSKBUILD_PROJECT_NAME=jaxcc \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DJAXCC_ENABLE_CUDA=OFF -DJAXCC_SANITIZE=address,undefined
	$(CMAKE) --build $(SANITIZE_DIR) --target _jaxcc_cpu
	touch $@

$(INSTALL_STAMP): $(DEPS_STAMP) $(NCCL_STAMP) $(NATIVE_SOURCES) CMakeLists.txt pyproject.toml $(JAXLIB_VERSION)
	$(PY) -m pip install --no-build-isolation --no-deps -e . \
	  $(if $(JAXCC_ENABLE_CUDA),-C cmake.define.JAXCC_ENABLE_CUDA=$(JAXCC_ENABLE_CUDA))
	touch $@
