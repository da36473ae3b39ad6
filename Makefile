# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@ $(VENV)/.installed

# The main job: train the default small ViT on the bundled digits, then classify a held-out digit and draw
# what the class token attends to.
demo: $(VENV)/.installed
	$(BIN)/vitkit train --out runs/demo --force
	$(BIN)/python -c "from vitkit.data import load_builtin; load_builtin('mnist5k')[1].load(0).save('runs/demo/digit.png')"
	$(BIN)/vitkit predict --model-dir runs/demo/final runs/demo/digit.png
	$(BIN)/vitkit attention --model-dir runs/demo/final runs/demo/digit.png --rollout --out runs/demo/attention.png

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .

test: lint
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
