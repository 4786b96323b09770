# Dev/test tasks for ckptfs.  Debian 12, run as root (or with sudo available).
#
#   make deps    what `make run` needs: system packages (fuse3, ...), .venv, pip install -e '.[dev]'
#   make run     local SeaweedFS S3 + ckptfs mounted on ./mnt (installs only what running needs)
#   make stop    unmount ./mnt (draining up to shutdown_timeout: returns even with the S3 server
#                hung), stop the local S3 and DELETE ITS DATA and the cache; make stop KEEP=1
#                stops both but keeps them (and what was not uploaded) for the next make run
#   make test    the test suite (PYTEST_ARGS="-x tests/unit" to narrow it), every test that mounts
#                once per FUSE transport (CKPTFS_FUSE_TRANSPORT=kernel|libfuse: one); adds the test, train
#                and bench extras (PyTorch...) and what the ops tests drive: prometheus, chromium,
#                nfs-ganesha, rpcbind, libnfs-utils, s3fs. Runs with CKPTFS_REQUIRE_EXTRAS=1: having
#                installed the extras, a test whose optional module (torch, transformers, selenium...)
#                does not import fails instead of skipping (a plain pytest skips it); each skip says why.
#                On TEST_WORKERS (2) pytest-xdist workers, each with its own SeaweedFS; the tests that run
#                NFS-Ganesha (one rpcbind per host) on one of them in turn. TEST_WORKERS=0: serially
#   make test-vm the core integration tests inside a VM booted with Debian 12's Linux 6.1 (FUSE
#                7.38, no passthrough) under qemu, both transports (scripts/test_vm.py); prints
#                `guest kernel: ...` and pytest's summary. `make test` runs them too where the guest
#                boots under KVM, and only the smoke test (write, fsync, rename, flush; both
#                transports, ~6 min) under TCG emulation; one line says which, or why none
#                (TEST_VM=0 skips them). make test-vm SELECTION=nfs: the NFS gateway with the
#                kernel's NFSv4.1 client instead (ckptfs, Ganesha and the client in the guest)
#   make bench   benchmarks into docs/benchmarks.md (BENCH_ARGS="--quick" for a small run);
#                adds the bench extra, s3fs and NFS-Ganesha with the libnfs client
#   make install the command in /opt/ckptfs (a venv) linked from /usr/local/bin, the systemd
#                unit, /etc/ckptfs, /var/cache/ckptfs, docs (DESTDIR= to stage; docs/install.md)
#   make uninstall  the reverse, keeping /etc/ckptfs and /var/cache/ckptfs
#   make docs    regenerate docs/configuration.md from gateway/config.py (the ckptfs.config module)
#   make clean   stop + remove dev state and caches; distclean also removes .venv

SHELL := /bin/bash

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
APT_PKGS := fuse3 libfuse3-dev pkg-config attr
# only for the tests and benchmarks: promtool + a Prometheus server, NFS-Ganesha and the libnfs client,
# systemd-analyze, s3fs (a peer in `make bench`, and in the tests' smoke run of it), chromium and
# chromium-driver (the catalogue page's tests drive it headless), etcd-server (peer_membership = etcd: the tests start one)
TEST_APT_PKGS := prometheus nfs-ganesha nfs-ganesha-vfs rpcbind libnfs-utils nfs-common systemd s3fs chromium chromium-driver etcd-server
# make bench: s3fs (a peer), NFS-Ganesha, rpcbind and libnfs's nfs-cp (what one NFS gateway serves)
BENCH_APT_PKGS := s3fs nfs-ganesha nfs-ganesha-vfs rpcbind libnfs-utils
# make test-vm: QEMU, Debian 12's kernel (only adds /boot and /lib/modules/6.1.0-*) and a static
# busybox for the guest's init; where they cannot be installed the VM tests say so and skip
VM_APT_PKGS := qemu-system-x86 linux-image-amd64 busybox-static
# 1: make test ends with the VM tests (the smoke selection under TCG, ~6 min; all of them under KVM)
TEST_VM ?= 1
# the pip extras of pyproject.toml each target installs into $(VENV), one stamp per set:
# run = the package with every feature (cold, ui) and the local S3 server; test = the whole suite
# (the training tests need PyTorch, the benchmark smoke test its peers); bench = the harness's tools
RUN_EXTRAS := dev,cold,ui,etcd
TEST_EXTRAS := test,train,bench,cold,ui,etcd
BENCH_EXTRAS := dev,bench,cold
RUN_STAMP := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test
BENCH_STAMP := $(VENV)/.installed-bench
# make stop KEEP=1: keep the local S3 server's data and the cache for the next make run
KEEP ?=
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# pytest-xdist workers for make test (0: none, in one process); --dist loadgroup keeps each xdist_group on one worker
TEST_WORKERS ?= 2
PYTEST_ARGS ?= -q -n $(TEST_WORKERS) --dist loadgroup tests
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

# make install: FHS places; DESTDIR stages them elsewhere (for packaging, or a test)
PREFIX ?= /opt/ckptfs
BINDIR ?= /usr/local/bin
UNITDIR ?= /etc/systemd/system
CONFDIR ?= /etc/ckptfs
CACHEDIR ?= /var/cache/ckptfs
DOCDIR ?= /usr/local/share/doc/ckptfs
DESTDIR ?=

.PHONY: help deps system-deps test-deps bench-deps vm-deps test test-vm run stop bench docs install relocate-venv uninstall clean distclean

help:
	@sed -n 's/^#   //p' $(firstword $(MAKEFILE_LIST))

deps: system-deps $(RUN_STAMP)

# apt-install the packages in $(1) that are missing
define apt_install
	@if ! command -v dpkg >/dev/null; then echo "deps: not Debian, install $(1) yourself"; exit 0; fi; \
	missing=""; \
	for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "deps: installing$$missing"; \
		$(SUDO) apt-get update -q && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi
endef

system-deps:
	$(call apt_install,$(APT_PKGS))

test-deps:
	$(call apt_install,$(TEST_APT_PKGS))

bench-deps:
	$(call apt_install,$(BENCH_APT_PKGS))

vm-deps:
	-$(call apt_install,$(VM_APT_PKGS))

$(PY):
	$(PYTHON) -m venv $(VENV)

$(RUN_STAMP): pyproject.toml | $(PY) system-deps
	$(PY) -m pip install -q -e '.[$(RUN_EXTRAS)]'
	touch $@

$(TEST_STAMP): pyproject.toml | $(PY) system-deps
	$(PY) -m pip install -q -e '.[$(TEST_EXTRAS)]'
	touch $@

$(BENCH_STAMP): pyproject.toml | $(PY) system-deps
	$(PY) -m pip install -q -e '.[$(BENCH_EXTRAS)]'
	touch $@

test: system-deps test-deps $(if $(filter 1,$(TEST_VM)),vm-deps) $(TEST_STAMP)
	CKPTFS_REQUIRE_EXTRAS=1 $(PY) -m pytest $(PYTEST_ARGS)
	@if [ "$(TEST_VM)" = 1 ]; then $(PY) scripts/test_vm.py --if-possible --selection auto; else echo "test-vm: skipped: TEST_VM=$(TEST_VM) (make test-vm runs them)"; fi

# test-deps: the guest runs the host's tools (Ganesha, rpcbind, nfs-common's mount.nfs4 for SELECTION=nfs)
test-vm: system-deps test-deps vm-deps $(TEST_STAMP)
	$(PY) scripts/test_vm.py $(if $(SELECTION),--selection $(SELECTION))

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
	@echo "  tear down:    make stop         (deletes the local S3 server's data and the cache)"
	@echo "                make stop KEEP=1  (keeps them for the next make run)"

stop:
	@if $(IS_MOUNTED); then \
		. $(DEV)/s3/env 2>/dev/null; \
		$(VENV)/bin/ckptfs unmount ./$(MNT) || echo "stop: ckptfs unmount failed, detaching the mount"; \
	fi
	@if $(IS_MOUNTED); then fusermount3 -uz $(MNT) || true; fi
	$(STOP_PY) scripts/dev_s3.py stop --dir $(DEV)/s3 $(if $(KEEP),--keep-data)
	$(if $(KEEP),@echo "kept $(DEV)/s3/data and $(DEV)/cache: make run uses them again; make stop without KEEP=1 deletes them",rm -rf $(DEV)/cache)
	@rmdir $(MNT) $(DEV) 2>/dev/null || true

bench: system-deps bench-deps $(BENCH_STAMP)
	$(PY) -m bench $(BENCH_ARGS)

docs: $(RUN_STAMP)
	$(PY) -c 'import pathlib, ckptfs.config as c; pathlib.Path("docs/configuration.md").write_text(c.markdown_reference())'

install: system-deps
	$(PYTHON) -m venv $(DESTDIR)$(PREFIX)
	$(DESTDIR)$(PREFIX)/bin/pip install -q --upgrade .
	$(if $(DESTDIR),$(MAKE) --no-print-directory relocate-venv)
	install -d -m 0755 $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(CONFDIR) $(DESTDIR)$(DOCDIR)
	install -d -m 0700 $(DESTDIR)$(CACHEDIR)
	ln -sfn $(PREFIX)/bin/ckptfs $(DESTDIR)$(BINDIR)/ckptfs
	sed -e 's|/usr/local/bin/ckptfs|$(BINDIR)/ckptfs|g' -e 's|/etc/ckptfs/|$(CONFDIR)/|g' \
		-e 's|/usr/local/share/doc/ckptfs|$(DOCDIR)|g' systemd/ckptfs@.service > $(DESTDIR)$(UNITDIR)/ckptfs@.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/ckptfs@.service
	install -m 0644 deploy/ckptfs.example.toml $(DESTDIR)$(CONFDIR)/example.toml.sample
	cp -r docs/. $(DESTDIR)$(DOCDIR)/
	cp -r deploy $(DESTDIR)$(DOCDIR)/
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi
	@echo "installed: $(BINDIR)/ckptfs -> $(PREFIX)/bin/ckptfs, $(UNITDIR)/ckptfs@.service, $(CONFDIR)/example.toml.sample"
	@echo "next: cp $(CONFDIR)/example.toml.sample $(CONFDIR)/NAME.toml, edit it, systemctl enable --now ckptfs@NAME (docs/install.md)"

# a venv names its own path (the scripts' #! lines, activate, pyvenv.cfg, the .pyc files' sources): staged
# under DESTDIR, make them name PREFIX, where the tree runs once a package puts it there
relocate-venv:
	@staged="$(abspath $(DESTDIR)$(PREFIX))"; \
	grep -rlIZF -- "$$staged" "$$staged/bin" "$$staged/pyvenv.cfg" | xargs -0 -r sed -i "s|$$staged|$(PREFIX)|g"; \
	"$$staged/bin/python" -m compileall -q -f -s "$(abspath $(DESTDIR))" -p / "$$staged" >/dev/null; \
	if left=$$(grep -rlF -- "$$staged" "$$staged"); then echo "install: $$staged still named in: $$left"; exit 1; fi

uninstall:
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ] && systemctl list-units --no-legend 'ckptfs@*' | grep -q .; then \
		echo "uninstall: stop the ckptfs@ services first (systemctl stop 'ckptfs@*')"; exit 1; fi
	rm -f $(DESTDIR)$(BINDIR)/ckptfs $(DESTDIR)$(UNITDIR)/ckptfs@.service
	rm -rf $(DESTDIR)$(PREFIX) $(DESTDIR)$(DOCDIR)
	@echo "kept $(CONFDIR) and $(CACHEDIR) (a cache dir may hold data not yet uploaded: mount it once more to drain it)"

clean: stop
	rm -rf $(DEV) .pytest_cache *.egg-info build bench/results/tmp
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
