# Two commands set up a fresh machine: `make demo` and `make test`. Both create .venv when
# it is missing and install requirements.txt when it changed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Test processes side by side (pytest-xdist); whole files go to one worker, so a module's
# shared run is set up once. make test runs three on the 2-core test machine: its browser
# tests wait on pages and timers, and a third worker fills those waits (13:06 to 14:13
# against 14:24 with two, 2026-11-27; four: 14:17 against 13:29 with three, 2026-11-29). make test-fast is busy all the time: two (2:15
# against 2:22 with three).
TEST_WORKERS ?= 3
FAST_WORKERS ?= 2
XDIST := --dist loadfile
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test test-fast ui lint bench bench-ui bench-peers bench-gpu clean-venv

$(STAMP): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q -r requirements.txt
	touch $(STAMP)

demo: $(STAMP)
	$(PY) app.py --no-ui --preset demo

# The tests start about 150 Python processes (trainers, cache builds, app.py); each would
# compile core/ again where PYTHONDONTWRITEBYTECODE is set (0.2 s a process), so the
# bytecode is written once first (__pycache__/ is ignored by git).
COMPILE := $(PY) -m compileall -q core ui app.py

test: $(STAMP)
	./tools/ensure-chromium.sh
	$(COMPILE)
	$(PY) -m pytest -q -n $(TEST_WORKERS) $(XDIST)

test-fast: $(STAMP)
	$(COMPILE)
	$(PY) -m pytest -q -n $(FAST_WORKERS) $(XDIST) -m "not slow"

ui: $(STAMP)
	$(PY) app.py

lint: $(STAMP)
	$(PY) -m ruff check .

bench: $(STAMP)
	$(PY) bench/scan.py

bench-ui: $(STAMP)
	$(PY) bench/ui_latency.py

# This tool against diffusers' own LoRA trainers (tiny sd15 and flux on the CPU, minutes);
# the examples' torchvision and datasets go to bench/.peers-venv, not requirements.txt.
bench-peers: $(STAMP)
	$(PY) bench/peers.py --omp-passive

# Needs a CUDA GPU for measured figures; without one it prints the estimates only.
# requirements-gpu.txt adds bitsandbytes (nf4, adamw8bit) for the GPU.
GPU_STAMP := $(VENV)/.installed-gpu-stamp
$(GPU_STAMP): $(STAMP) requirements-gpu.txt
	$(PY) -m pip install --disable-pip-version-check -q -r requirements-gpu.txt
	touch $(GPU_STAMP)

bench-gpu: $(GPU_STAMP)
	$(PY) bench/gpu_memory.py

clean-venv:
	rm -rf $(VENV)
