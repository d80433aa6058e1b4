PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Test modules run in this many processes (pytest-xdist, a module whole in one): on 2 cores the
# suite spends much of its time waiting on servers it started: 2 take 652 s where 1 takes 830.
TEST_WORKERS ?= 2

.PHONY: serve test lint typecheck clean browser postgresql

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/headrace serve $(ARGS)

test: $(STAMP) browser postgresql
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile $(ARGS)

# The dashboard's browser test drives Debian's Chromium (Playwright's own download cannot be
# reached from here). Installed when missing and root; otherwise that test skips, saying why.
browser:
	@test -x /usr/bin/chromium || { test "$$(id -u)" = 0 && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || \
	  echo "chromium not installed: the dashboard's browser test will skip"; }

# The PostgreSQL ledger's tests start a server of Debian's `postgresql` (docs/ledger.md).
# Installed when missing and root; otherwise those tests skip, saying why.
postgresql:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { test "$$(id -u)" = 0 && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null) || \
	  echo "postgresql not installed: the PostgreSQL ledger's tests will skip"; }

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

clean:
	rm -rf $(VENV)
