# fleetrl: `make train` and `make test` set everything up on a fresh machine, then run.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
EXTRAS ?= atari,mujoco,envpool,video,tune,track,stats,dev
# The CPU build of torch. A GPU user installs the build for their CUDA into .venv first (see README);
# setup never replaces a torch that is already installed.
TORCH_CPU ?= torch==2.13.0
STAMP  := $(VENV)/.fleetrl-installed

.PHONY: setup train test test-fast clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_CPU)"
	@$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	@touch $(STAMP)

setup: $(STAMP)

train: setup
	$(VENV)/bin/fleetrl train ppo --env-id CartPole-v1

# pytest exits 5 when it collected no tests: that is a failure here, never a silent pass.
test: setup
	@$(PY) -m pytest -q -ra --durations=20; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

test-fast: setup
	@$(PY) -m pytest -q -ra -m "not slow"; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

clean:
	rm -rf $(VENV) runs build *.egg-info .pytest_cache
