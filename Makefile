# Developer entry points.
#
#   make test                                  build jaxcc into .venv, run tests/
#   make test PYTEST_ARGS=tests/test_reduce.py  a subset (any pytest arguments;
#                                              tests/ is run unless they name tests)
#   make demo                                  run examples/demo.py
#   make install                               only (re)build and install jaxcc
#
# .venv is created with python3.11 (else python3, which must be >= 3.11). jaxcc
# is installed editable and without build isolation, so its native modules are
# compiled against the jaxlib that runs them; they are rebuilt only when a
# native source, CMakeLists.txt, pyproject.toml or the installed jaxlib changes.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
DEPS := jax numpy optax absl-py pytest matplotlib nanobind scikit-build-core ninja
CMAKE_MIN := 3.18
PYTEST_ARGS ?=
TEST_PATHS := $(if $(filter tests%,$(PYTEST_ARGS)),,tests)

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

.PHONY: all install test demo clean

all: install

install: $(INSTALL_STAMP)

test: $(INSTALL_STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS) $(TEST_PATHS)

demo: $(INSTALL_STAMP)
	$(PY) examples/demo.py

clean:
	rm -rf build $(INSTALL_STAMP)

$(PY):
	@test -n "$(PYTHON)" || { echo "error: neither python3.11 nor python3 is on PATH" >&2; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else \
	  "error: jaxcc needs Python >= 3.11, $(PYTHON) is " + sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)

# Runtime, test and build dependencies; a cmake from PyPI if the system has none
# (or one older than CMAKE_MIN).
$(DEPS_STAMP): Makefile | $(PY)
	$(PY) -m pip install -q $(DEPS)
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

$(INSTALL_STAMP): $(DEPS_STAMP) $(NCCL_STAMP) $(NATIVE_SOURCES) CMakeLists.txt pyproject.toml $(JAXLIB_VERSION)
	$(PY) -m pip install --no-build-isolation --no-deps -e .
	touch $@
