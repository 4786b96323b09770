# Dev/test tasks for ckptfs.  Debian 12, run as root (or with sudo available).
#
#   make deps    system packages (fuse3, ...), .venv, pip install -e '.[test,train]'
#   make test    the test suite (PYTEST_ARGS="-x tests/unit" to narrow it)
#   make run     local SeaweedFS S3 + ckptfs mounted on ./mnt
#   make stop    unmount ./mnt (flushing), stop the local S3, drop its data
#   make bench   benchmarks (once bench/ exists)
#   make clean   stop + remove dev state and caches; distclean also removes .venv

SHELL := /bin/bash

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
APT_PKGS := fuse3 libfuse3-dev pkg-config attr
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

PYTEST_ARGS ?= -q tests
BENCH_ARGS ?=

DEV := .dev
MNT := mnt
BUCKET := ckpt
METRICS_ADDR := 127.0.0.1:9464
# findmnt reads the mount table, so it also sees a dead FUSE mount ("transport endpoint is not connected")
IS_MOUNTED := findmnt -rn --mountpoint "$(abspath $(MNT))" >/dev/null 2>&1
# dev_s3.py stop needs no third-party module, so it also works without the venv
STOP_PY = $(if $(wildcard $(PY)),$(PY),$(PYTHON))

.DEFAULT_GOAL := help
.PHONY: help deps system-deps test run stop bench clean distclean

help:
	@sed -n 's/^#   //p' $(firstword $(MAKEFILE_LIST))

deps: system-deps $(STAMP)

system-deps:
	@if ! command -v dpkg >/dev/null; then echo "deps: not Debian, install $(APT_PKGS) yourself"; exit 0; fi; \
	missing=""; \
	for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "deps: installing$$missing"; \
		$(SUDO) apt-get update -q && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	fi

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY) system-deps
	$(PY) -m pip install -q -e '.[test,train]'
	touch $@

test: deps
	$(PY) -m pytest $(PYTEST_ARGS)

run: deps
	$(PY) scripts/dev_s3.py start --dir $(DEV)/s3 --bucket $(BUCKET)
	@if $(IS_MOUNTED) && ! stat $(MNT)/. >/dev/null 2>&1; then \
		echo "$(MNT): stale mount (daemon gone), detaching it"; fusermount3 -uz $(MNT); \
	fi
	mkdir -p $(MNT) $(DEV)/cache
	@if $(IS_MOUNTED); then \
		echo "$(MNT) is already mounted"; \
	else \
		cmd=($(VENV)/bin/ckptfs mount s3://$(BUCKET) ./$(MNT) --cache-dir $(DEV)/cache \
			--endpoint-url "$$(cat $(DEV)/s3/endpoint)" --metrics-addr $(METRICS_ADDR) --daemon); \
		echo ". $(DEV)/s3/env && $${cmd[*]}"; \
		. $(DEV)/s3/env && "$${cmd[@]}"; \
	fi
	@echo
	@echo "ckptfs is mounted on ./$(MNT), draining to s3://$(BUCKET) at $$(cat $(DEV)/s3/endpoint)"
	@echo "  credentials:  . $(DEV)/s3/env"
	@echo "  write:        dd if=/dev/urandom of=$(MNT)/step_1.bin bs=1M count=64 conv=fsync"
	@echo "  state:        $(VENV)/bin/ckptfs status ./$(MNT)"
	@echo "  make durable: $(VENV)/bin/ckptfs flush ./$(MNT)"
	@echo "  metrics:      curl -s http://$(METRICS_ADDR)/metrics | grep ^ckptfs_"
	@echo "  S3 log:       $(DEV)/s3/data/weed.log"
	@echo "  tear down:    make stop"

stop:
	@if $(IS_MOUNTED); then \
		. $(DEV)/s3/env 2>/dev/null; \
		$(VENV)/bin/ckptfs unmount ./$(MNT) --flush || echo "stop: ckptfs unmount failed, detaching the mount"; \
	fi
	@if $(IS_MOUNTED); then fusermount3 -uz $(MNT) || true; fi
	$(STOP_PY) scripts/dev_s3.py stop --dir $(DEV)/s3
	rm -rf $(DEV)/cache
	@rmdir $(MNT) $(DEV) 2>/dev/null || true

bench: deps
	@if [ -d bench ]; then $(PY) -m bench $(BENCH_ARGS); else echo "bench: not yet (no bench/ directory)"; fi

clean: stop
	rm -rf $(DEV) .pytest_cache *.egg-info bench/results/tmp
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
