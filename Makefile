# Two commands on a fresh machine: `make run` serves the example repository, `make test` passes the
# tests. Each creates .venv if missing and installs the pinned ranges from pyproject.toml: `make run`
# the server and the examples extra (onnx, to build the example models), `make test` the test extra.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MODELS := examples/models
# Prints the path of a perf_analyzer that runs: $PERF_ANALYZER as given (exit 2 when it does not
# run), else one found or installed (exit 1 when none can be had, saying why).
FIND_PERF_ANALYZER = $(PY) -m harness.perf_analyzer
REQUESTS := examples/requests
PYTEST_ARGS ?=

.PHONY: run test test-fast docs-check fuzz install install-examples install-dev install-test models proto bench clean image image-run

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# Each stamp says what is installed; a larger install touches the stamps of what it includes.
$(VENV)/.installed: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e .
	touch $@

# examples: what examples/build_repository.py needs besides the server (onnx); `make run`.
$(VENV)/.installed-examples: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[examples]'
	touch $@ $(VENV)/.installed

# dev: the build tools (grpcio-tools for `make proto`); test includes them.
$(VENV)/.installed-dev: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@ $(VENV)/.installed

$(VENV)/.installed-test: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@ $(VENV)/.installed-examples $(VENV)/.installed-dev $(VENV)/.installed

install: $(VENV)/.installed
install-examples: $(VENV)/.installed-examples
install-dev: $(VENV)/.installed-dev
install-test: $(VENV)/.installed-test

# The checks CI runs before the tests: ruff's lint and format check, then mypy over the product
# packages and bench/ (the list, bench's excluded model repositories and peers/, and the settings
# are in pyproject.toml; the cache in .mypy_cache). mypy needs
# the test extras too (onnx, httpx, opentelemetry are imported by harness/, examples/ and otel.py),
# so lint installs them. `make fmt` rewrites instead: ruff format, then ruff's safe fixes.
.PHONY: lint fmt
lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

fmt: $(VENV)/.installed-dev
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The example repository, and the request bodies the README's curl examples send.
models: $(VENV)/.installed-examples
	$(PY) examples/build_repository.py --output $(MODELS)
	$(PY) examples/request_files.py --output $(REQUESTS)

run: $(VENV)/.installed-examples models
	$(PY) -m server --model-repository $(MODELS)

# perf_analyzer's tests get one (see FIND_PERF_ANALYZER); where none can be had they skip, and the
# end of the run lists them with the command that enables them. A given one that does not run
# stops here.
test: $(VENV)/.installed-test
	@pa=$$($(FIND_PERF_ANALYZER)); rc=$$?; \
	if [ $$rc -eq 2 ]; then exit 2; fi; \
	if [ $$rc -eq 0 ]; then export PERF_ANALYZER="$$pa"; echo "perf_analyzer: $$pa"; \
	else unset PERF_ANALYZER; echo "perf_analyzer: none, its tests will skip (listed at the end)"; fi; \
	$(PY) -m pytest tests $(PYTEST_ARGS)

# The README's examples, run as written against a fresh server (tests/e2e/docs; part of `make test`).
docs-check: $(VENV)/.installed-test
	$(PY) -m pytest tests/e2e/docs $(PYTEST_ARGS)

# The unit tests only (no server subprocess, nothing slow, no soak): well under a minute.
test-fast: $(VENV)/.installed-test
	$(PY) -m pytest tests -m "not e2e and not slow and not soak" $(PYTEST_ARGS)

# The fuzz tests (tests/e2e/hostile_input/test_fuzz_*.py) with thousands of cases each, for nightly runs;
# `make test` runs the same tests with a short budget. Failing cases are kept in .hypothesis/
# and replayed first next time. FUZZ_EXAMPLES=N sets the base number of cases per test.
FUZZ_EXAMPLES ?=
fuzz: $(VENV)/.installed-test
	ASCEND_FUZZ=nightly ASCEND_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest \
		tests/e2e/hostile_input/test_fuzz_http.py tests/e2e/hostile_input/test_fuzz_grpc.py --timeout=0 \
		--hypothesis-show-statistics $(PYTEST_ARGS)

# The long soak and chaos run (bench/soak/run.py, see bench/README.md); `make test` runs a
# two-minute one (tests/soak). SOAK_SECONDS sets the length of the chaos.
.PHONY: soak
SOAK_SECONDS ?= 1800
soak: $(VENV)/.installed-test
	$(PY) -m bench.soak.run --seconds $(SOAK_SECONDS) --negative-control-seconds 30

# Triton 2.51 for bench/cpu_side_by_side.py (run by bench/run.py): installed into .venv-triton when
# missing; if that fails the benchmark still runs and its report says Triton was not measured.
TRITON_VENV := .venv-triton
TRITON_WHEEL := nvidia-pytriton==0.7.0
KSERVE_VENV := .venv-kserve
KSERVE_PACKAGE := kserve==0.21.0

bench: $(VENV)/.installed-test models
	@if ! ls -d $(TRITON_VENV)/lib/python3*/site-packages/pytriton/tritonserver >/dev/null 2>&1; then \
		echo "installing $(TRITON_WHEEL) into $(TRITON_VENV) (for the side-by-side with Triton)"; \
		{ $(PYTHON) -m venv $(TRITON_VENV) && $(TRITON_VENV)/bin/pip install --quiet $(TRITON_WHEEL); } \
			|| echo "could not install $(TRITON_WHEEL): the report will say Triton was not measured"; \
	fi
	@if ! ls -d $(KSERVE_VENV)/lib/python3*/site-packages/kserve >/dev/null 2>&1; then \
		echo "installing $(KSERVE_PACKAGE) into $(KSERVE_VENV) (the peer of bench/kserve_peer.py)"; \
		{ $(PYTHON) -m venv $(KSERVE_VENV) && $(KSERVE_VENV)/bin/pip install --quiet $(KSERVE_PACKAGE); } \
			|| echo "could not install $(KSERVE_PACKAGE): the report will say KServe was not measured"; \
	fi
	@pa=$$($(FIND_PERF_ANALYZER)) || { echo "make bench needs perf_analyzer (why none was found \
		or installed: above); give one: PERF_ANALYZER=/path/to/perf_analyzer make bench" >&2; exit 1; }; \
	echo "perf_analyzer: $$pa"; PERF_ANALYZER="$$pa" $(PY) -m bench.run

# The CPU image without a docker daemon (deploy/docker/build-image.sh): buildah with chroot
# isolation on a debootstrapped Debian base; needs root and apt's buildah, debootstrap, umoci;
# minutes, outputs in .image/. Not part of `make test`. image-run runs its entrypoint in a chroot
# with the example repository and probes it with curl (deploy/docker/run-image.sh).
image:
	bash deploy/docker/build-image.sh

image-run: models
	bash deploy/docker/run-image.sh

clean:
	rm -rf $(VENV) $(MODELS) $(REQUESTS) .pytest_cache .hypothesis

PROTO_TOOLS := $(VENV)/.installed-dev
include protocol/proto/proto.mk

# NVIDIA's own qa suites (qa/L0_* of triton-inference-server/server) against this server,
# unchanged: QA_DIR is that repository's qa folder (nothing is fetched). See tests/qa/run_qa.py.
.PHONY: qa
QA_DIR ?=
QA_SUITES ?= L0_model_queue L0_batcher L0_lifecycle
$(VENV)/.installed-qa: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[qa]'
	touch $@ $(VENV)/.installed-test $(VENV)/.installed-examples $(VENV)/.installed-dev $(VENV)/.installed
qa: $(VENV)/.installed-qa
	@if [ -z "$(QA_DIR)" ]; then echo "make qa needs QA_DIR=/path/to/server/qa"; exit 2; fi
	$(PY) tests/qa/run_qa.py --qa-dir $(QA_DIR) $(QA_SUITES)
