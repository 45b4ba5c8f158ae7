# Two commands do all set-up: `make demo` builds .venv with what the demo and
# the package need (requirements.txt) and `make test` adds the suite's extras
# (requirements-dev.txt: the frameworks, JAX/torchax, the zoo's model
# libraries, pytest); both reuse what is there (docs/benchmarks.md has the
# measured set-up times).
PY        := .venv/bin/python
PIP       := .venv/bin/pip
STAMP     := .venv/.requirements-installed
DEV_STAMP := .venv/.requirements-dev-installed
EXT       := $(wildcard xla_amp/_C*.so)
SOURCES   := $(wildcard csrc/*.cpp csrc/*/*.cpp csrc/*/*.h) setup.py pyproject.toml xla_amp/_version_check.py
MAX_JOBS ?= 2
export PJRT_DEVICE ?= CPU
PIP_QUIET  = 2>&1 | grep -v "^WARNING: Location" || true

.PHONY: all venv venvs dev current build bazel wheel test integrations sharded faults torchax fp8 launchers zoo zoo-large demo bench docs clean

all: test

$(STAMP): requirements.txt
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install -q --upgrade pip $(PIP_QUIET)
	$(PIP) install -q -r requirements.txt $(PIP_QUIET)
	$(PY) -c "import torch, torch_xla"  # fail here, not in the tests
	touch $(STAMP)

$(DEV_STAMP): $(STAMP) requirements-dev.txt
	$(PIP) install -q -r requirements-dev.txt $(PIP_QUIET)
	$(PIP) install -q --no-deps --force-reinstall torchax==0.0.13 $(PIP_QUIET)
	$(PY) -c "import torchax; assert torchax.__version__ == '0.0.13', torchax.__version__"
	touch $(DEV_STAMP)

# The `current` profile: Python 3.12, torch 2.15, jax 0.12, torchax, torch-tpu
# in .venv-current (requirements-current.txt says why), without torch_xla.
# pip's machine-wide cap (torch<=2.14.1, /etc/xdg/pip) is for .venv's pins;
# PIP_CONFIG_FILE=/dev/null lifts it for this venv only. The tests marked
# `core` run here on the CPU-backed stand-in PrivateUse1 device
# (tests/support/standin_tpu.py); TORCH_DEVICE_BACKEND_AUTOLOAD=0 keeps
# `import torch` from loading torch_tpu (the tests that want it import it,
# in a network namespace of their own: libtpu looks for cloud metadata).
CUR_PY      := .venv-current/bin/python
CUR_STAMP   := .venv-current/.requirements-installed
PYTHON312   ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) python3.12)
$(CUR_STAMP): requirements-current.txt
	test -x $(CUR_PY) || $(PYTHON312) -m venv .venv-current
	PIP_CONFIG_FILE=/dev/null $(CUR_PY) -m pip install -q -r requirements-current.txt $(PIP_QUIET)
	$(CUR_PY) -c "import site; print('$(CURDIR)')" > "$$($(CUR_PY) -c 'import site; print(site.getsitepackages()[0])')/xla_amp_checkout.pth"
	TORCH_DEVICE_BACKEND_AUTOLOAD=0 $(CUR_PY) -c "import torch, jax; assert torch.__version__.startswith('2.15'), torch.__version__"
	touch $(CUR_STAMP)

# The native engine for this torch (xla_amp._C against torch 2.15, serving
# AutocastPrivateUse1): the same csrc/ as `make build`, built incrementally
# by ninja into build/*-current, installed beside the torch 2.9 library
# (Python 3.12's file name) with its own record (_build_info_cpython_312.py).
CUR_EXT_SUFFIX = $(shell $(CUR_PY) -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
CUR_RECORD     = $(shell $(CUR_PY) -c 'import sys; print("_build_info_" + sys.implementation.cache_tag.replace("-", "_"))')
xla_amp/.built-current: $(CUR_STAMP) $(SOURCES)
	@mkdir -p build
	@echo "building xla_amp._C for .venv-current (log: build/ext-current.log)"
	@start=$$(date +%s); PATH="$(CURDIR)/.venv-current/bin:$$PATH" MAX_JOBS=$(MAX_JOBS) $(CUR_PY) setup.py \
	  build_ext --build-lib build/lib-current --build-temp build/temp-current > build/ext-current.log 2>&1 \
	  || (grep -B2 -A8 "error" build/ext-current.log | head -80; exit 1); \
	  echo "xla_amp._C for .venv-current built in $$(( $$(date +%s) - start )) s"
	@install -m 755 build/lib-current/xla_amp/_C$(CUR_EXT_SUFFIX) xla_amp/.C-current.so.tmp && mv -f xla_amp/.C-current.so.tmp xla_amp/_C$(CUR_EXT_SUFFIX)
	@install -m 644 build/lib-current/xla_amp/$(CUR_RECORD).py xla_amp/.$(CUR_RECORD).py.tmp && mv -f xla_amp/.$(CUR_RECORD).py.tmp xla_amp/$(CUR_RECORD).py
	TORCH_DEVICE_BACKEND_AUTOLOAD=0 $(CUR_PY) -c "from xla_amp import _engine; assert _engine.privateuse1_native() is not None, _engine.privateuse1_problem()"
	touch $@

# $(call beside,command,log,foreground command,what): `command` in the
# background, its output into build/`log`, while the foreground one runs;
# then that output under "== `what`, beside it:". Fails if either failed.
beside = mkdir -p build; $(1) > build/$(2) 2>&1 & bg=$$!; $(3); rc=$$?; \
	wait $$bg; rc_bg=$$?; echo "== $(4), beside it:"; cat build/$(2); \
	test $$rc = 0 && test $$rc_bg = 0

# Two runs: torchax renames PrivateUse1 "jax" for its whole process, the
# stand-in device names it "tpu". They run side by side (the torchax one,
# one process, ~30 s, mostly one test, beside the other's two workers; its
# output after the other's): 64 s of tests, against 79 s one after the other.
CUR_PYTEST = TORCH_DEVICE_BACKEND_AUTOLOAD=0 $(CUR_PY) -m pytest -q --durations=10
current: xla_amp/.built-current
	@$(call beside,$(CUR_PYTEST) -m "core and torchax" tests/torchax,current-torchax.log,\
	  $(CUR_PYTEST) $(XDIST) -m "core and not torchax" tests,the torchax run (core and torchax))

venv: $(STAMP)
dev: $(DEV_STAMP)

# Both venvs and both builds of the extension, .ci/run's first step: `make
# build dev`, with the current profile's venv and extension (above) built
# beside it. pip unpacks and byte-compiles one file at a time, on one core,
# so two installs side by side share the two cores instead of taking turns.
# The current profile's output follows .venv's.
venvs:
	@$(call beside,$(MAKE) --no-print-directory xla_amp/.built-current,venv-current.log,\
	  $(MAKE) --no-print-directory build dev,.venv-current and its extension)

# Put library $(1) and its build record $(2) where the package loads them;
# rename, not overwrite: running processes keep the old file mapped.
EXT_SUFFIX = $(shell $(PY) -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
define install_lib
@install -m 755 $(1) xla_amp/.C.so.tmp && mv -f xla_amp/.C.so.tmp xla_amp/_C$(EXT_SUFFIX)
@install -m 644 $(2) xla_amp/._build_info.py.tmp && mv -f xla_amp/._build_info.py.tmp xla_amp/_build_info.py
endef

# The extension is rebuilt (incrementally, with ninja) only when csrc/ or
# setup.py changed; a .pth file makes the checkout importable (editable).
# With _C comes xla_amp/_build_info.py: the torch/torch_xla it was built
# against, checked when xla_amp is imported (xla_amp/_version_check.py).
xla_amp/.built: $(STAMP) $(SOURCES)
	@mkdir -p build
	@echo "building xla_amp._C (log: build/ext.log)"
	@MAX_JOBS=$(MAX_JOBS) $(PY) setup.py build_ext --build-lib build/lib > build/ext.log 2>&1 || (grep -B2 -A8 "error" build/ext.log | head -80; exit 1)
	$(call install_lib,build/lib/xla_amp/_C$(EXT_SUFFIX),build/lib/xla_amp/_build_info.py)
	$(PY) -c "import site; print('$(CURDIR)')" > "$$($(PY) -c 'import site; print(site.getsitepackages()[0])')/xla_amp_checkout.pth"
	$(PY) -c "import xla_amp._C"
	touch $@

build: xla_amp/.built

# Bazel, as PyTorch/XLA builds: WORKSPACE + BUILD compile csrc/ against the
# torch of .venv (bazel/torch.bzl asks it for its paths), offline (Debian's
# bazel-bootstrap 4.2.3 and bazel-rules-java; bazel/rules_cc stands in for
# rules_cc). Installs the library in place of setup.py's and runs the engine
# tests on it; the next `make build` puts setup.py's library back.
BAZEL       := bazel --max_idle_secs=300
BAZEL_FLAGS := -c opt --repo_env=XLA_AMP_PYTHON=$(CURDIR)/$(PY) --symlink_prefix=build/bazel- \
               --experimental_no_product_name_out_symlink --jobs=$(MAX_JOBS)
SUDO        := $(if $(filter 0,$(shell id -u)),,sudo)
bazel: $(STAMP) dev
	@command -v bazel >/dev/null && test -d /usr/share/bazel/rules/java || \
	  $(SUDO) apt-get install -y -q bazel-bootstrap bazel-rules-java || \
	  ($(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q bazel-bootstrap bazel-rules-java)
	@mkdir -p build
	@echo "bazel build //:_C.so (log: build/bazel.log)"
	@$(BAZEL) build $(BAZEL_FLAGS) //:_C.so //:build_info > build/bazel.log 2>&1 || (grep -v linux-sandbox build/bazel.log | tail -60; exit 1)
	@grep "Elapsed time" build/bazel.log
	@rm -f xla_amp/.built
	$(call install_lib,build/bazel-bin/_C.so,build/bazel-bin/_build_info.py)
	$(PY) -c "import xla_amp, xla_amp._build_info as b; assert b.BUILDER == 'bazel', b.BUILDER"
	$(PYTEST) tests/engine/test_engine.py

# A wheel for an existing torch_xla environment (dist/; Requires-Dist pins
# the torch / torch_xla release series it was built against).
wheel: $(STAMP)
	MAX_JOBS=$(MAX_JOBS) $(PIP) wheel --no-build-isolation --no-deps -w dist .

# The suite: tests/<folder>/ mirrors xla_amp/'s subpackages; each target
# below `make test` is a marker (tests/conftest.py marks the folders that are
# wholly one target: tests/zoo, tests/torchax). Budgets are wall-clock on the
# slower 2-core CI host (no AVX-512); .ci/run prints each target's time
# beside its budget. --durations prints the slowest tests. In-process graphs
# compile at XLA's backend optimisation 0 (tests/conftest.py).
# A worker that dies ends the run (--max-worker-restart=0): with a restarted
# worker, xdist 3.8's scope scheduler re-queues the dead one's finished files
# and the run hangs (pinned in tests/suite/test_suite_scheduling.py). What
# native code writes to stderr goes to the log, not into pytest's capture,
# which a dying process takes with it (--capture=sys: a native abort's cause,
# docs/upstream/xla_cpu_memory_maps.md; ~10 lines of C++ warnings a make test).
TEST_WORKERS ?= 2
PYTEST   := $(PY) -m pytest -q --capture=sys
XDIST     = -n $(TEST_WORKERS) --dist loadgroup --max-worker-restart=0

# Everything not marked for a target below, on two xdist workers; the groups
# of subprocess-heavy tests each on one worker at a time (tests/conftest.py).
# No test over 30 s. Budget 8 min on the faster host, 10 on the slower.
test: build dev
	@start=$$(date +%s); $(PYTEST) $(XDIST) --durations=25 tests; rc=$$?; \
	  took=$$(( $$(date +%s) - start )); \
	  printf "make test: %d:%02d (budget 8:00 on the faster host, 10:00 on the slower)%s\n" \
	    $$((took / 60)) $$((took % 60)) "$$([ $$took -gt 600 ] && echo '  OVER BUDGET')"; \
	  exit $$rc

# Each target below collects only where its marker's tests are: its folder
# (tests/conftest.py, TARGET_FOLDERS) and the files of the layout test's
# ELSEWHERE that carry the marker (tests/suite/test_layout_of_tests.py checks
# both sides). Collecting the whole tree costs each worker ~6 s.

# xla_amp inside Lightning (Trainer, Fabric), Accelerate and the Transformers
# Trainer: the frameworks' own loops on XLA:CPU (tests/integrations).
integrations: build dev
	$(PYTEST) $(XDIST) -m integrations --durations=10 tests/integrations tests/api/test_layout.py

# Sharded mixed precision (xla_amp.sharded, tests/sharded): FSDPv2 runs of a
# GPT-2 and a ResNet on 2 and 4 virtual XLA:CPU devices (1-D and 2-D meshes),
# each in its own process against the one-device run, and sharded
# checkpoints restored in a fresh process; a one-GPU user's SPMD mode
# against plain mode (XLA:CPU stand-in).
sharded: build dev
	$(PYTEST) $(XDIST) -m sharded --durations=10 tests/sharded

# Checkpoints under real faults (tests/checkpoint, marker `faults`): launchers
# killed with SIGKILL (once frozen inside a write) and SIGTERM at seeded
# moments, a full and a read-only tmpfs in a private mount namespace
# (RLIMIT_FSIZE where there is none), two runs on one path, crafted pickles,
# and every cell of the precision matrix on resume. Three workers on the two
# cores: the signals go at seeded moments of the run's own CPU time, which
# another process on the cores does not move (tests/support/faults.py,
# Running.wait_cpu), and a third worker fills the time the others wait on
# their processes (3:34-4:18 against 4:25-4:27 on two workers;
# docs/benchmarks.md, "Test suite").
FAULTS_WORKERS ?= 3
faults: TEST_WORKERS = $(FAULTS_WORKERS)
faults: build dev
	$(PYTEST) $(XDIST) -m faults --durations=10 tests/checkpoint

# xla_amp on torchax (PyTorch on JAX, tests/torchax): policy parity with the
# torch_xla engine over the op tables, HLO dtypes, jitted training of a
# GPT-2-shaped LM and a ResNet-18, loss-scaling skips on 1 and 4 devices, two
# processes on one JAX mesh (jax.distributed, gloo), resume, bad input.
torchax: build dev
	$(PYTEST) $(XDIST) -m torchax --durations=10 tests/torchax tests/api/test_layout.py

# xla_amp.fp8 on whole models (tests/fp8, marker `fp8`): a GPT-2-shaped LM
# trained 200 steps in fp8 against bf16 AMP (make test holds the layer,
# HLO-form, numerics and digits-MLP tests).
fp8: build dev
	$(PYTEST) $(XDIST) -m fp8 --durations=10 tests/fp8

# The launchers' longest end-to-end runs (tests/launchers, marker
# `launchers`): a resumed run equals an uninterrupted one, float16 under the
# cuda rules, --fp8, --compile, an ImageFolder run (make test runs the rest
# of tests/launchers).
launchers: build dev
	$(PYTEST) $(XDIST) -m launchers --durations=10 tests/launchers

# Whole models (tests/zoo): torchvision's under every policy, Transformers
# (GPT-2, Llama, Mistral, BERT, T5) and timm (ViT, EfficientNet-B0, ConvNeXt,
# ResNet-D) lazily under every policy and each compiled under one of them,
# and real models compiled against lazy bit for bit. A model's variants share
# one served process's compilations and its fp32 run; the sweeps go out one
# by one to whichever worker is free (tests/conftest.py, SuiteUnits).
zoo: build dev
	$(PYTEST) $(XDIST) -m zoo --durations=0 tests/zoo

# DenseNet-121 alone, one process per variant: 25 minutes on 2 cores, peak ~10 GB
# (the four variants in one process grew past 23 GB; not in CI).
zoo-large: build dev
	$(PY) -m pytest -q -m zoo_large tests/zoo/test_zoo.py

# The main job: AMP training on real handwritten digits (sklearn's, shipped in
# the package), GradScaler + a syncfree optimizer, on XLA:CPU.
demo: build
	$(PY) scripts/train_mnist_amp.py --target_accuracy 97

# Eleven CPU benchmarks, each once with its defaults, and the GPU LLM
# benchmark's check of itself on the CPU (docs/benchmarks.md names them and
# how to run the rest: options, .venv-current, the GPU suite).
bench: build dev
	$(PY) benchmarks/trace_cost.py
	$(PY) benchmarks/syncfree_step.py
	$(PY) benchmarks/compiled_step.py
	$(PY) benchmarks/allreduce_buckets.py
	$(PY) benchmarks/peers.py
	$(PY) benchmarks/zoo.py
	$(PY) benchmarks/integrations.py
	$(PY) benchmarks/sharded.py
	$(PY) benchmarks/checkpoint_write.py
	$(PY) benchmarks/torchax_lm.py
	$(PY) benchmarks/fp8.py
	$(PY) -m benchmarks.llm --smoke

clean:
	rm -rf build dist xla_amp/_C*.so xla_amp/_build_info*.py xla_amp/.built xla_amp/.built-current *.egg-info
