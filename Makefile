# fleetrl: `make train` and `make test` set everything up on a fresh machine, then run.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
EXTRAS ?= atari,mujoco,envpool,video,tune,track,stats,multiagent,export,dev
# The CPU build of torch. A GPU user installs the build for their CUDA into .venv first (see README);
# setup never replaces a torch that is already installed.
TORCH_CPU ?= torch==2.13.0
STAMP  := $(VENV)/.fleetrl-installed

.PHONY: setup train test test-fast bench-learning clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q --no-compile "$(TORCH_CPU)"
	@$(PY) -m pip install -q --no-compile -e ".[$(EXTRAS)]"
	@# pip byte-compiles on one core; compileall writes the same .pyc files on all of them. They must exist: where
	@# PYTHONDONTWRITEBYTECODE is set (our CI hosts), an import never writes them. Files that are not Python 3
	@# (templates, test data) fail to compile, as pip lets them, quietly.
	@$(PY) -m compileall -q -j 0 $$($(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") >/dev/null 2>&1 || true
	@touch $(STAMP)

setup: $(STAMP)

train: setup
	$(VENV)/bin/fleetrl train ppo --env-id CartPole-v1

# The suite in two passes: the tests marked `serial` (timing- or load-sensitive) first, alone; then the rest in
# $(TEST_WORKERS) pytest-xdist workers (on 2 cores a third was slower: the suite is CPU-bound; docs/benchmarks.md). Each
# module's tests stay in one worker (--dist loadscope), so a module-scoped fixture (the torchrun job of test_every_algorithm) is made once
# and the Slurm tests share one cluster. pytest exits 5 when it collected no tests: that is a failure, never a pass.
TEST_WORKERS ?= 2
# the serial pass collects only the files that mark a test `serial` (collecting all of them costs seconds of imports)
SERIAL_FILES = $(shell grep -l 'mark\.serial' tests/test_*.py)
define run_suite
	@$(PY) -m pytest -q -ra -m "serial$(1)" $(SERIAL_FILES); first=$$?; \
	$(PY) -m pytest -q -ra --durations=20 -n $(TEST_WORKERS) --dist loadscope -m "not serial$(1)"; rest=$$?; \
	if [ $$first -eq 5 ] || [ $$rest -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; \
	if [ $$first -ne 0 ]; then exit $$first; fi; exit $$rest
endef

test: setup
	$(call run_suite,)

test-fast: setup
	$(call run_suite, and not slow)

# The learning runs of minutes that `make test` leaves out (it keeps a check of about 20 s per algorithm): each
# algorithm to its bar, one table (benchmarks/learning.py; e.g. make bench-learning ARGS="--suite full --seeds 1-3")
bench-learning: setup
	$(PY) benchmarks/learning.py $(ARGS)

clean:
	rm -rf $(VENV) runs build *.egg-info .pytest_cache
