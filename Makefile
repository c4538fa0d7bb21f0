# Two commands do all the set-up on a fresh machine:
#   make demo   - the main job (creates .venv, installs vitkit, runs it)
#   make test   - the test suite (same environment, plus the peers environment for the comparisons and one
#                 environment per extra, each with only the core and that extra)
# The CPU build of torch is pinned for the install (TORCH_PIN); the package accepts torch>=2.13, the oldest build CI tests.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_PIN ?= torch==2.13.0
# torch comes from PyTorch's CPU wheel index (TORCH_INDEX), not PyPI's default build (CUDA on Linux, several GB
# more). The index is probed once per make run, at the first install that needs it (one HTTPS request, 5 s
# timeout); when it does not answer (no network, a machine with only local package indexes in pip's config),
# torch is installed from pip's configured indexes instead, and make says so. `make TORCH_INDEX=` skips the
# probe and uses pip's configuration; TORCH_INDEX_ARGS=... sets pip's arguments for torch directly.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_INDEX_ARGS = $(eval TORCH_INDEX_ARGS := $(if $(TORCH_INDEX),$(shell \
  $(PY) -c 'import sys, urllib.request as r; r.urlopen(sys.argv[1] + "/torch/", timeout=5)' $(TORCH_INDEX) \
  2>/dev/null && echo --index-url $(TORCH_INDEX) || \
  echo "make: $(TORCH_INDEX) does not answer: torch from the indexes in pip's configuration" >&2)))$(TORCH_INDEX_ARGS)
PEERS ?= .venv-peers
PEERS_LOCK ?= requirements/peers.txt
PEERS_MB ?= 5300
PYTEST_ARGS ?=

.PHONY: venv venv-test lint data browser demo analysis-figures test test-fast test-peers test-reproduce-extra \
	test-extras test-extras-core peers api-docs clean
FMNIST ?= /usr/share/datasets/fashion-mnist

# The demo needs only the core and matplotlib; the tests add their extras (scipy, scikit-image,
# transformers, onnx) on top of the same environment. --no-compile: pip does not byte-compile every module
# of every package at install time (most of torch's are never imported); Python compiles what is imported,
# on first use. It keeps the demo's install short (the demo is timed with it).
$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --no-compile $(TORCH_PIN) $(TORCH_INDEX_ARGS)
	$(BIN)/pip install -q --no-compile -e '.[plots]'
	touch $@

# The test environment (also the one `vitkit reproduce` and the benchmarks run in) is byte-compiled once, in
# parallel, after its install: where PYTHONDONTWRITEBYTECODE is set (as on CI's machines) Python never caches
# what it compiles on import, and every new process would compile torch._dynamo and sympy again (about 5 s;
# torch.optim imports them when the first optimiser is built). A file that does not compile (some packages
# ship sources for other Python versions) is left to be compiled on import, as without this step.
$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install -q --no-compile -e '.[test]'
	$(BIN)/python -m compileall -q -q -j 0 "$$($(call PURELIB,$(VENV)))" || :
	touch $@

venv: $(VENV)/.installed
venv-test: $(VENV)/.installed-test

lint: venv-test
	$(BIN)/ruff check src tests benchmarks

# Fashion-MNIST: Debian's /usr/share/datasets/fashion-mnist when it is there; otherwise `vitkit data fetch
# fashion-mnist` downloads the four files from Zalando's server (FMNIST_URL: another base URL, a mirror) into the
# user's data folder ($$VITKIT_DATA_DIR, else ~/.cache/vitkit/data/fashion-mnist), each checked against its
# SHA-256; no root needed, and files already there are checked, not fetched again. When that fails and we
# are root, Debian's dataset-fashion-mnist package is tried. Fails (with what to do) when nothing provides
# the data, so the tests that need it never skip for want of it.
FMNIST_URL ?=
data: venv
	@if [ -f $(FMNIST)/train-images-idx3-ubyte.gz ]; then :; \
	elif $(BIN)/vitkit data fetch fashion-mnist $(if $(FMNIST_URL),--base-url '$(FMNIST_URL)'); then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "make data: trying Debian's dataset-fashion-mnist package instead" >&2; \
	  (apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1 || \
	   (apt-get update -qq >/dev/null && apt-get install -y -qq dataset-fashion-mnist >/dev/null)) && \
	  [ -f $(FMNIST)/train-images-idx3-ubyte.gz ] && echo "installed Fashion-MNIST into $(FMNIST)" || \
	  { echo "could not install Fashion-MNIST (apt-get install dataset-fashion-mnist failed)" >&2; exit 1; }; \
	else exit 1; fi

# Chromium and its driver for the browser test of `vitkit serve`'s page (tests/test_serve_browser.py), from
# Debian's packages when they are missing and we are root: about 30 s the first time (26-33 s measured, with
# apt-get update), nothing once they are there. Fails when it cannot install them, so the test never skips for
# want of a browser where it could have one; elsewhere (not root) the test skips and says why.
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  start=$$(date +%s); \
	  (apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1 || \
	   (apt-get update -qq >/dev/null && apt-get install -y -qq chromium chromium-driver >/dev/null)) && \
	  command -v chromedriver >/dev/null && \
	  echo "installed chromium and chromium-driver in $$(( $$(date +%s) - start )) s" || \
	  { echo "could not install chromium (apt-get install chromium chromium-driver failed)" >&2; exit 1; }; \
	else echo "chromium is not installed: the browser test will skip (sudo apt-get install chromium chromium-driver)"; fi

# The main job: train a small ViT from scratch on Fashion-MNIST, evaluate it on the 10,000 test images,
# save the model (runs/demo/model), the curves and a few predictions, print the test accuracy.
DEMO_OUT ?= runs/demo
DEMO_ARGS ?=
demo: venv data
	rm -rf $(DEMO_OUT)
	$(BIN)/vitkit train --recipe fmnist-demo --out $(DEMO_OUT) $(DEMO_ARGS)

# The analysis figures of docs/analysis.md (rollout, attention distance, position-embedding similarity,
# embedding filters, few-shot) from the demo model; `make demo` first.
analysis-figures: venv-test data
	PATH=$(abspath $(BIN)):$$PATH bash docs/figures/analysis/make_figures.sh $(DEMO_OUT)/model

# The whole suite: the linter (rules in pyproject.toml, [tool.ruff]), the core tests in the main environment
# (with $$VITKIT_BACKEND unset: every choice auto), then the tests whose numbers or graphs depend on the kernels
# once per fixed backend (so a machine kind whose measurement picks the other library is covered here too),
# then the comparisons with timm, torchvision and Hugging Face (marked `peers`) in the peers environment, then
# each extra's commands in an environment with only the core and that extra (test-extras, below).
# -rs prints every skip with its reason.
BACKEND_TESTS ?= tests/test_backend.py tests/test_inference.py tests/test_export.py tests/test_axial.py \
	tests/test_config.py tests/test_model.py tests/test_readout.py
FIXED_BACKENDS ?= gemm=aten,attention=fused gemm=onednn,attention=explicit
test: venv-test peers data browser lint
	env -u VITKIT_BACKEND $(BIN)/python -m pytest -q -rs -m "not peers" $(PYTEST_ARGS)
	for b in $(FIXED_BACKENDS); do echo "== VITKIT_BACKEND=$$b"; \
	  VITKIT_BACKEND=$$b $(BIN)/python -m pytest -q -m "not peers and not slow" -p no:cacheprovider \
	    $(BACKEND_TESTS) $(PYTEST_ARGS) || exit 1; done
	env -u VITKIT_BACKEND $(PEERS)/bin/python -m pytest -q -rs -m peers $(PYTEST_ARGS)
	$(MAKE) test-extras TORCH_INDEX_ARGS='$(TORCH_INDEX_ARGS)'  # the probe's answer, not a second probe

# Each extra's commands, for real, in an environment with only the core and that extra (tests/extras_smoke.py
# says what runs: ONNX and OpenVINO exports checked by their runtimes, a served classification, the figures,
# Hugging Face timed by vitkit bench, TensorBoard files, a loopback Hub, reproduce end to end, all at tiny
# settings): the test environment installs every extra, so it would hide a command that imports a package its
# extra does not declare. In the core-only environment each of those commands must stop before any work with
# exit code 1 and one line naming the extra. torch is installed once, into $(CORE_ENV); each
# .venv-extra-NAME sees the core environment's packages (a .pth file, as a venv sees the system's with
# --system-site-packages) and gets `pip install -e '.[NAME]'` on top (the core environment's pip, so no
# pip of its own to install). The environments are rebuilt when
# pyproject.toml changes; pip's cache serves the packages. `make test-extra-NAME` runs one extra.
EXTRAS ?= onnx openvino serve plots bench hf log hub reproduce
CORE_ENV ?= .venv-core
EXTRA_TOOLS_reproduce := pytest  # its tests run under pytest
PURELIB = $(1)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'

$(CORE_ENV)/.installed: pyproject.toml
	rm -rf $(CORE_ENV)
	$(PY) -m venv $(CORE_ENV)
	$(CORE_ENV)/bin/pip install -q $(TORCH_PIN) $(TORCH_INDEX_ARGS)
	$(CORE_ENV)/bin/pip install -q -e .
	touch $@

.venv-extra-%/.installed: $(CORE_ENV)/.installed
	rm -rf $(@D)
	$(PY) -m venv --without-pip $(@D)
	echo "import site; site.addsitedir('$$($(call PURELIB,$(CORE_ENV)))')" > "$$($(call PURELIB,$(@D)))/_vitkit_core.pth"
	$(CORE_ENV)/bin/pip --python $(@D)/bin/python install -q -e '.[$*]' $(EXTRA_TOOLS_$*)
	touch $@

.PRECIOUS: .venv-extra-%/.installed  # a stamp, not an intermediate file for make to delete

test-extra-%: .venv-extra-%/.installed
	env -u VITKIT_BACKEND .venv-extra-$*/bin/python tests/extras_smoke.py $*

test-extras-core: $(CORE_ENV)/.installed
	env -u VITKIT_BACKEND $(CORE_ENV)/bin/python tests/extras_smoke.py core

# every environment first (a build failure stops here), then every check; the failures named at the end
test-extras: $(CORE_ENV)/.installed $(foreach e,$(EXTRAS),.venv-extra-$(e)/.installed)
	@failed=""; \
	env -u VITKIT_BACKEND $(CORE_ENV)/bin/python tests/extras_smoke.py core || failed="$$failed core"; \
	for e in $(EXTRAS); do \
	  env -u VITKIT_BACKEND .venv-extra-$$e/bin/python tests/extras_smoke.py $$e || failed="$$failed $$e"; done; \
	if [ -n "$$failed" ]; then echo "make test-extras: failed in the environment of:$$failed" >&2; exit 1; fi

# the reproduce extra's environment alone (its place in test-extras)
test-reproduce-extra: test-extra-reproduce

# The core tests only (no peers environment to build), without those marked slow.
test-fast: venv-test data browser lint
	$(BIN)/python -m pytest -q -rs -m "not slow and not peers" $(PYTEST_ARGS)

# timm and torchvision need a torch build that torchvision matches (torch 2.14.1, a CUDA build that runs on
# the CPU). The environment is pinned in $(PEERS_LOCK) and installed without dependency resolution, so that
# torch's GPU-only extras (triton, cuSOLVER) stay out: about 5 GB instead of 6.1. The disk is checked first
# so that a full disk is one clear line, not a pip traceback half-way through.
# A new lock rebuilds the environment from scratch (nothing stale stays); a new pyproject.toml only
# reinstalls vitkit into it.
$(PEERS)/.locked: $(PEERS_LOCK)
	@free=$$(df -Pm . | awk 'NR==2 {print $$4}'); have=$$(du -sm $(PEERS) 2>/dev/null | cut -f1); \
	if [ $$((free + $${have:-0})) -lt $(PEERS_MB) ]; then \
	  echo "make peers: the peers environment needs about $(PEERS_MB) MB of disk; $$free MB are free here" >&2; exit 1; fi
	rm -rf $(PEERS)
	$(PY) -m venv $(PEERS)
	$(PEERS)/bin/pip install -q --no-deps -r $(PEERS_LOCK)
	touch $@

$(PEERS)/.installed: $(PEERS)/.locked pyproject.toml
	$(PEERS)/bin/pip install -q --no-deps -e .
	touch $@

peers: $(PEERS)/.installed

test-peers: peers data
	$(PEERS)/bin/python -m pytest -q -rs -m peers $(PYTEST_ARGS)

# The API reference from the docstrings (pdoc), into docs/api/ (not committed; tests/test_api_reference.py
# builds it in every test run, so a docstring pdoc cannot render or an undocumented export fails CI).
api-docs: venv-test
	$(BIN)/python -m pdoc -o docs/api vitkit $$($(BIN)/python -c "import pkgutil, vitkit; print(' '.join(m.name for m in pkgutil.walk_packages(vitkit.__path__, 'vitkit.') if not m.name.endswith('__main__')))")

clean:
	rm -rf $(VENV) $(PEERS) $(CORE_ENV) .venv-extra-* .venv-reproduce build src/*.egg-info .pytest_cache
