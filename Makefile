# EvoPool Studio. `make run`: set up and open the studio on the bundled demo. `make test`: set up and run every test.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fast test-all test-serial setup browser lint bench clean

# constraints.txt pins the versions the test suite passed with, so a fresh machine installs those.
$(STAMP): pyproject.toml constraints.txt
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test,browser,ray,hf]'
	touch $(STAMP)

setup: $(STAMP)

# Debian's headless Chromium for the end-to-end test (skipped where it cannot be installed).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	  else echo "chromium not installed and no root apt-get: the browser test will skip"; fi; }

run: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/streamlit run streamlit_app.py --server.headless true

# ruff, then every test but the `slow` ones (`make test-all` runs those too) on two pytest-xdist workers (CI has 2
# cores): whole files to a worker so each file's module fixtures (an evolved workspace, a Ray cluster) are built once,
# the browser tests and the longest files first (tests/conftest.py), so no worker is left alone with a long file at
# the end. `make test-serial` runs every test in one process.
test: lint browser
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "not slow"

# the unit tier in about three minutes: everything but the browser, the `slow` and the `heavy` files (tests/conftest.py)
test-fast: lint
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q -n 2 -m "not slow and not e2e and not heavy"

test-all: $(STAMP) browser
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q -n 2 --dist loadfile --no-loadscope-reorder

test-serial: $(STAMP) browser
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check engine studio pages tests bench streamlit_app.py

bench: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python bench/quality.py
	HF_HUB_OFFLINE=1 $(BIN)/python bench/embed_speed.py
	HF_HUB_OFFLINE=1 $(BIN)/python bench/scale.py

clean:
	rm -rf $(VENV) .pytest_cache
