# ggrad: `make demo` trains on the default device, `make test` runs the suite.
# Both set everything up first (scripts/bootstrap.sh): .venv, packages, and the
# Vulkan build of ggml where this machine can have it (cached in ~/.cache/ggrad).
PY := .venv/bin/python
RUN := . scripts/env.sh && $(PY)

.PHONY: setup test demo vulkan cpu bench clean

setup:
	bash scripts/bootstrap.sh

test: setup
	$(RUN) -m pytest $(PYTEST_ARGS)

demo: setup
	$(RUN) examples/digits.py

bench: setup
	$(RUN) bench/step_transfers.py

vulkan:
	GGRAD_BACKEND=vulkan bash scripts/bootstrap.sh

cpu:
	GGRAD_BACKEND=cpu bash scripts/bootstrap.sh

clean:
	rm -rf .venv .pytest_cache
