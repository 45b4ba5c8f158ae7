# Two commands do all set-up: `make demo` and `make test` build .venv when it
# is missing (about 2 minutes) and reuse it otherwise.
PY      := .venv/bin/python
PIP     := .venv/bin/pip
STAMP   := .venv/.requirements-installed
EXT     := $(wildcard xla_amp/_C*.so)
SOURCES := $(wildcard csrc/*.cpp csrc/*/*.cpp csrc/*/*.h) setup.py
export PJRT_DEVICE ?= CPU

.PHONY: all venv build test zoo zoo-large demo bench docs clean

all: test

$(STAMP): requirements.txt
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
	$(PIP) install -q -r requirements.txt 2>&1 | grep -v "^WARNING: Location" || true
	$(PY) -c "import torch, torch_xla"  # fail here, not in the tests
	touch $(STAMP)

venv: $(STAMP)

# The extension is rebuilt (incrementally, with ninja) only when csrc/ or
# setup.py changed; a .pth file makes the checkout importable (editable).
xla_amp/.built: $(STAMP) $(SOURCES)
	@mkdir -p build
	@echo "building xla_amp._C (log: build/ext.log)"
	@MAX_JOBS=2 $(PY) setup.py build_ext --build-lib build/lib > build/ext.log 2>&1 || (grep -B2 -A8 "error" build/ext.log | head -80; exit 1)
	@# rename, not overwrite: running processes keep the old file mapped
	@for so in build/lib/xla_amp/_C*.so; do cp "$$so" xla_amp/.C.so.tmp && mv -f xla_amp/.C.so.tmp "xla_amp/$$(basename $$so)"; done
	$(PY) -c "import site; print('$(CURDIR)')" > "$$($(PY) -c 'import site; print(site.getsitepackages()[0])')/xla_amp_checkout.pth"
	$(PY) -c "import xla_amp._C"
	touch $@

build: xla_amp/.built

test: build
	$(PY) -m pytest -q tests

# The model-zoo sweep: the torchvision models of tests/test_zoo.py under every
# policy (make test runs a subset), one model at a time: RegNet-Y alone grows
# past 8 GB while it compiles, and two large models side by side were killed
# for memory on 24 GB.
zoo: build
	$(PY) -m pytest -q -m zoo tests/test_zoo.py

# DenseNet-121 alone, one process per variant: 25 minutes on 2 cores, peak ~10 GB
# (the four variants in one process grew past 23 GB; not in CI).
zoo-large: build
	$(PY) -m pytest -q -m zoo_large tests/test_zoo.py

# The main job: AMP training on real handwritten digits (sklearn's, shipped in
# the package), GradScaler + a syncfree optimizer, on XLA:CPU.
demo: build
	$(PY) scripts/train_mnist_amp.py --target_accuracy 97

bench: build
	$(PY) benchmarks/trace_cost.py
	$(PY) benchmarks/syncfree_step.py
	$(PY) benchmarks/compiled_step.py
	$(PY) benchmarks/allreduce_buckets.py
	$(PY) benchmarks/peers.py
	$(PY) benchmarks/zoo.py

clean:
	rm -rf build xla_amp/_C*.so xla_amp/.built *.egg-info
