# klviz: two commands.
#   make lab    set up the environment (first time only) and open the lessons in JupyterLab
#               (make lab LANG=zh: the Simplified Chinese lessons, built from notebooks/locale/;
#               make present LESSON=02 LANG=zh: a Chinese lesson in presenter mode)
#   make test   run every test: unit, property, panels, notebooks (nbval), real browser
#   make test-hub   a real JupyterHub with two students (root, npm, network; CI runs it after make test)
#   make test-themes   every lesson's own figures in both themes (CI runs it)
#   make lint   ruff (lint and format), mypy on the whole package, notebooks clean and paired (CI runs it first)
#   make sync-notebooks   clean the notebooks and rewrite their percent scripts (after editing a lesson)
#
# Torch: by default a CPU build (no multi-GB CUDA download). GPU users:
#   make lab TORCH_INDEX=https://download.pytorch.org/whl/cu128
# (any PyTorch wheel index; or install torch into .venv yourself before `make lab`).

PYTHON      ?= python3
VENV        ?= .venv
TORCH_VERSION ?= 2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
PORT        ?=
BIN         := $(VENV)/bin
PY          := $(BIN)/python
STAMP       := $(VENV)/.klviz-installed

LESSON      ?= 00
THEME       ?=
# `make lab LANG=zh`: only a LANG given on the command line picks the edition (the environment's LANG
# is the locale); the Chinese lessons are built into build/lessons-zh and copied like `klviz lab` does.
EDITION     := $(if $(filter command line,$(origin LANG)),$(LANG),en)
# the Chinese edition, built for nbval by `make test` (generated, never stored: code exists once)
ZH_BUILD    := build/zh
# `make test` runs in TEST_WORKERS processes (pytest-xdist), a test file each at a time (a notebook's
# cells share one kernel, so they must stay together): two halve the suite's time on two cores.
# TEST_WORKERS=0 runs everything in this process.
TEST_WORKERS ?= 2
PARALLEL    := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

.PHONY: FORCE lab test lint setup test-fast test-notebooks test-browser test-hub test-themes present site tiny-lm sample-rollouts \
        bench bench-memory strip sync-notebooks translations clean

lab: $(STAMP)
ifeq ($(EDITION),en)
	@$(PY) -m klviz.labcmd notebooks --in-place --no-browser $(if $(PORT),--port $(PORT))
else
	@LANG=C.UTF-8 $(PY) -m klviz.labcmd build/lessons-$(EDITION) --lang $(EDITION) --no-browser $(if $(PORT),--port $(PORT))
endif

setup: $(STAMP)

TORCH_STAMP := $(VENV)/.klviz-torch

# Torch is (re)installed whenever TORCH_VERSION or TORCH_INDEX differ from what .venv holds, so
# `make lab TORCH_INDEX=...` takes effect on an existing environment too.
$(TORCH_STAMP): FORCE
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if [ "$$(cat $@ 2>/dev/null)" != "$(TORCH_VERSION) $(TORCH_INDEX)" ]; then \
	   if [ "$(TORCH_INDEX)" = "https://download.pytorch.org/whl/cpu" ] && \
	      $(PY) -m pip install --quiet --no-index --no-deps "torch==$(TORCH_VERSION)" 2>/dev/null; then :; \
	   else $(PY) -m pip install --quiet --force-reinstall --no-deps "torch==$(TORCH_VERSION)" \
	          --index-url "$(TORCH_INDEX)" && \
	        $(PY) -m pip install --quiet "torch==$(TORCH_VERSION)" --index-url "$(TORCH_INDEX)" \
	          --extra-index-url https://pypi.org/simple; fi && \
	   echo "$(TORCH_VERSION) $(TORCH_INDEX)" > $@; fi

$(STAMP): pyproject.toml constraints.txt $(TORCH_STAMP)
	@# CPU torch: a wheel already on this machine (offline cache) if there is one, else the CPU index (above).
	@# pip compiles one file at a time; compileall then uses every core and skips transformers' 2,600 model files
	@# (pulled in by the TRL integration's test, which imports one tiny GPT-2) and the packages' own test suites
	@# (2,900 files never imported): setup stays within 3 minutes, and no test's first import of torch pays for
	@# compiling it (the memory tests measure a fresh process).
	@$(PY) -m pip install --quiet --no-compile -c constraints.txt -e ".[test,dev]"
	@$(PY) -m compileall -q -j 0 -x '/site-packages/(transformers/models/|.*/tests?/)' $(VENV)/lib > /dev/null || true
	@touch $(STAMP)
	@echo "klviz environment ready in $(VENV)"

test: $(STAMP)             # finds (or installs) a Chromium first: scripts/ensure_browser.py says how
	@$(PY) scripts/translations.py build --out $(ZH_BUILD) >/dev/null
	@chromium="$$($(PY) scripts/ensure_browser.py)" && KLVIZ_CHROMIUM="$$chromium" \
	  $(PY) -m pytest --nbval-lax $(PARALLEL) tests notebooks $(ZH_BUILD)

lint: $(STAMP)             # what CI checks before the tests (all four run; fails if any fails)
	@status=0; \
	 $(BIN)/ruff check . || status=1; \
	 $(BIN)/ruff format --check --output-format concise . || status=1; \
	 $(BIN)/mypy || status=1; \
	 $(PY) scripts/sync_notebooks.py --check || status=1; \
	 exit $$status

test-fast: $(STAMP)
	@$(PY) -m pytest -q tests --ignore=tests/browser

test-notebooks: $(STAMP)
	@$(PY) scripts/translations.py build --out $(ZH_BUILD) >/dev/null
	@$(PY) -m pytest -q --nbval-lax notebooks $(ZH_BUILD)

translations: $(STAMP)     # merge the English lessons into notebooks/locale/*.po (then translate what is new or fuzzy)
	@$(PY) scripts/translations.py update
	@$(PY) scripts/translations.py --check || true

test-browser: $(STAMP)
	@chromium="$$($(PY) scripts/ensure_browser.py)" && KLVIZ_CHROMIUM="$$chromium" $(PY) -m pytest -q tests/browser

# Every lesson's own figures on both pages (tests/themes): each lesson runs once more per page, a few
# minutes. make test checks every panel in both themes and that no lesson writes a colour out. CI runs it.
test-themes: $(STAMP)
	@$(PY) -m pytest -q -m themes $(PARALLEL) tests/themes

# A real JupyterHub for two students (tests/hub): klviz's wheel and jupyterhub installed from the package
# index into a fresh environment, configurable-http-proxy from npm, docs/jupyterhub_config.py. Needs root
# (it creates and removes two Unix users), npm and the network; about five minutes. CI runs it.
test-hub: $(STAMP)
	@command -v npm >/dev/null || { echo "make test-hub needs npm (configurable-http-proxy comes from npm)"; exit 1; }
	@chromium="$$($(PY) scripts/ensure_browser.py)" && KLVIZ_CHROMIUM="$$chromium" $(PY) -m pytest -q -m hub tests/hub

present: $(STAMP)          # make present LESSON=02 THEME=dark [LANG=zh]: one lesson as a clean app (Voila)
	@$(PY) -m klviz.present $(LESSON) $(if $(THEME),--theme $(THEME)) --lang $(EDITION)

site: $(STAMP)             # both editions: English in build/site, Chinese in build/site/zh
	@$(PY) -m klviz.site --out build/site

tiny-lm: $(STAMP)          # retrain the shipped tiny LM from its seed (about 2 minutes); --check compares
	@$(PY) scripts/train_tiny_lm.py

sample-rollouts: $(STAMP)  # rebuild klviz/data/sample_rollouts.npz from the tiny LM
	@$(PY) scripts/make_sample_rollouts.py

bench-memory: $(STAMP)     # each lesson kernel's peak memory in JupyterLab, and the students a 16 GB hub holds
	@chromium="$$($(PY) scripts/ensure_browser.py)" && KLVIZ_CHROMIUM="$$chromium" $(PY) benchmarks/lesson_memory.py

bench: $(STAMP)            # the figures of benchmarks/README.md
	@$(PY) benchmarks/estimator_stats.py --repeat 5
	@$(PY) benchmarks/exact_kl.py --repeat 3
	@$(PY) benchmarks/panels.py
	@$(PY) benchmarks/browser_panels.py

sync-notebooks: $(STAMP)   # clean notebooks/*.ipynb (no outputs, nbformat 4.5, cell ids), rewrite notebooks/scripts/*.py
	@$(PY) scripts/sync_notebooks.py

strip: sync-notebooks      # the old name

clean:
	rm -rf $(VENV) build .pytest_cache .hypothesis
