# Two commands do all the set-up on a fresh machine:
#   make demo   - the main job (creates .venv, installs vitkit, runs it)
#   make test   - the test suite (same environment)
# The CPU build of torch is pinned for the install (TORCH_PIN); the package itself accepts torch>=2.1.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_PIN ?= torch==2.13.0
PEERS ?= .venv-peers
PEERS_PIN ?= torch==2.14.1 torchvision==0.29.1
PYTEST_ARGS ?=

.PHONY: venv venv-test data demo analysis-figures test test-fast test-peers peers clean
FMNIST ?= /usr/share/datasets/fashion-mnist

# The demo needs only the core and matplotlib (about a minute to install); the tests add their extras
# (scipy, scikit-image, transformers, onnx: about another minute) on top of the same environment.
$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q $(TORCH_PIN)
	$(BIN)/pip install -q -e '.[plots]'
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install -q -e '.[test]'
	touch $@

venv: $(VENV)/.installed
venv-test: $(VENV)/.installed-test

# Fashion-MNIST from Debian's package when it is missing and we are root; otherwise say how to get it.
data:
	@if [ -f $(FMNIST)/train-images-idx3-ubyte.gz ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  (apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1 || \
	   (apt-get update -qq >/dev/null && apt-get install -y -qq dataset-fashion-mnist >/dev/null)) && \
	  echo "installed Fashion-MNIST into $(FMNIST)"; \
	else echo "Fashion-MNIST is not in $(FMNIST): run 'sudo apt-get install dataset-fashion-mnist'"; fi

# The main job: train a small ViT from scratch on Fashion-MNIST, evaluate it on the 10,000 test images,
# save the model (runs/demo/model), the curves and a few predictions, print the test accuracy.
DEMO_OUT ?= runs/demo
demo: venv data
	rm -rf $(DEMO_OUT)
	$(BIN)/vitkit train --recipe fmnist-demo --out $(DEMO_OUT)

# The analysis figures of docs/analysis.md (rollout, attention distance, position-embedding similarity,
# embedding filters, few-shot) from the demo model; `make demo` first.
analysis-figures: venv-test data
	PATH=$(abspath $(BIN)):$$PATH bash docs/figures/analysis/make_figures.sh $(DEMO_OUT)/model

test: venv-test data
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-fast: venv-test data
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

# timm and torchvision need a torch build that torchvision matches (large, CUDA; runs on the CPU).
$(PEERS)/.installed: pyproject.toml
	$(PY) -m venv $(PEERS)
	$(PEERS)/bin/pip install -q $(PEERS_PIN)
	$(PEERS)/bin/pip install -q timm -e '.[test]'
	touch $@

peers: $(PEERS)/.installed

test-peers: peers data
	$(PEERS)/bin/python -m pytest -q -m peers $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(PEERS) build src/*.egg-info .pytest_cache
