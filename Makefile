# Two entry points that do all set-up on a fresh machine:
#   make demo   plan and simulate the default model on the default machine (no GPU stack needed)
#   make test   lint, import contracts, and the CPU test suite (kernels under TRITON_INTERPRET=1)
# Each creates its own virtual environment. torch is pinned to the CPU build found on the CI disk;
# the GPU machine brings its own torch.
PYTHON ?= python3
DEMO_VENV := .venv-demo
TEST_VENV := .venv

.PHONY: demo test readme-tables clean

# On a machine with an NVIDIA driver the demo also installs the GPU stack, for the real fine-tune.
$(DEMO_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/python -m pip install -q --upgrade pip
	if command -v nvidia-smi >/dev/null 2>&1; then \
		$(DEMO_VENV)/bin/python -m pip install -q -e '.[gpu]'; \
	else \
		$(DEMO_VENV)/bin/python -m pip install -q -e .; \
	fi
	touch $@

$(TEST_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(TEST_VENV)
	$(TEST_VENV)/bin/python -m pip install -q --upgrade pip
	$(TEST_VENV)/bin/python -m pip install -q torch==2.13.0
	$(TEST_VENV)/bin/python -m pip install -q -e '.[gpu,data,dev,tensorboard]'
	touch $@

demo: $(DEMO_VENV)/.installed
	$(DEMO_VENV)/bin/slide demo

test: $(TEST_VENV)/.installed
	$(TEST_VENV)/bin/ruff check .
	$(TEST_VENV)/bin/ruff format --check .
	$(TEST_VENV)/bin/lint-imports
	$(TEST_VENV)/bin/mypy
	$(TEST_VENV)/bin/python -m pytest -q

# README.md's Measured table from bench/results.csv (the test suite fails when they differ)
readme-tables: $(TEST_VENV)/.installed
	$(TEST_VENV)/bin/python -m bench.results --write-readme

clean:
	rm -rf $(DEMO_VENV) $(TEST_VENV) out
