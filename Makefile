# `make run`: set up both environments and the models (the first time: minutes), then serve
#             SmolLM2-135M-Instruct through the worker and answer a chat and a streaming job.
# `make test`: set up what is missing and run the whole suite.
.PHONY: setup run test bench

setup:
	bash scripts/setup.sh

run: setup
	.venv/bin/python scripts/demo.py

test: setup
	.venv/bin/python -m pytest -ra

bench: setup
	.venv/bin/python bench/proxy.py
	.venv/bin/python bench/startup.py
	.venv/bin/python bench/bad_config.py
