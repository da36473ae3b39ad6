# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint clean browser

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@ $(VENV)/.installed

# The main job: train the default small ViT on the bundled digits, then classify a held-out digit, draw what the
# class token attends to, and write the page that explores every token's attention.
demo: $(VENV)/.installed
	$(BIN)/vitkit train --out runs/demo --force
	$(BIN)/python -c "from vitkit.data import load_builtin; load_builtin('mnist5k')[1].load(0).save('runs/demo/digit.png')"
	$(BIN)/vitkit predict --model-dir runs/demo/final runs/demo/digit.png
	$(BIN)/vitkit attention --model-dir runs/demo/final runs/demo/digit.png --rollout --out runs/demo/attention.png
	$(BIN)/vitkit explore --model-dir runs/demo/final runs/demo/digit.png --out runs/demo/explorer.html

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .

# The explorer's browser tests drive Debian's Chromium (Playwright, with the system browser: nothing downloaded at run
# time). Installed here when missing and this is a Debian machine run as root; elsewhere those tests say why they skip.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1; } || \
	echo "make test: no Chromium (apt-get install chromium): the explorer's browser tests will be skipped"

test: lint browser
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
