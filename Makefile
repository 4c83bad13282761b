# ggrad: `make demo` trains on the default device, `make test` runs the suite.
# Both set everything up first (scripts/bootstrap.sh): .venv, packages, and the
# CUDA or Vulkan build of ggml where this machine can have it (cached in ~/.cache/ggrad).
# `make cuda`, `make vulkan`, `make cpu` switch builds; so does GGRAD_BACKEND=cuda make test.
PY := .venv/bin/python
RUN := . scripts/env.sh && $(PY)

.PHONY: setup test demo cuda vulkan cpu bench clean

setup:
	bash scripts/bootstrap.sh

test: setup
	$(RUN) -m pytest $(PYTEST_ARGS)

demo: setup
	$(RUN) examples/digits.py

bench: setup
	$(RUN) bench/step_transfers.py

cuda:
	GGRAD_BACKEND=cuda bash scripts/bootstrap.sh

vulkan:
	GGRAD_BACKEND=vulkan bash scripts/bootstrap.sh

cpu:
	GGRAD_BACKEND=cpu bash scripts/bootstrap.sh

clean:
	rm -rf .venv .pytest_cache
