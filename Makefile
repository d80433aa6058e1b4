PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: serve test lint typecheck clean browser

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/headrace serve $(ARGS)

test: $(STAMP) browser
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy
	$(BIN)/pytest -q $(ARGS)

# The dashboard's browser test drives Debian's Chromium (Playwright's own download cannot be
# reached from here). Installed when missing and root; otherwise that test skips, saying why.
browser:
	@test -x /usr/bin/chromium || { test "$$(id -u)" = 0 && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || \
	  echo "chromium not installed: the dashboard's browser test will skip"; }

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

clean:
	rm -rf $(VENV)
