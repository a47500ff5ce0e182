# cairn's one task runner. On a fresh machine `make demo` and `make test` do everything:
# each installs what is missing first (scripts/install-deps.sh, idempotent).
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo
# Where cargo puts its builds: CARGO_TARGET_DIR or a cargo config may move it off ./target.
TARGET_DIR = $(or $(shell $(CARGO) metadata --format-version 1 --no-deps 2>/dev/null | \
	sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p'),target)
RELEASE = $(TARGET_DIR)/release
# `make install` puts `cairn` in $(DESTDIR)$(PREFIX)/bin.
PREFIX ?= /usr/local
export CARGO
# Extra arguments for `cairn bench run`, e.g. BENCH_ARGS="--reps 5 --workloads create-unlink".
BENCH_ARGS ?=
FUZZ_SECS ?= 60

.PHONY: all deps build demo test bench fuzz crash install uninstall fstests

all: build

deps:
	@bash scripts/install-deps.sh

build: deps
	$(CARGO) build --release -p cairn-cli -p cairn-bench

# `cairn` (every subcommand, `cairn bench` included) on the PATH. For `mount -t cairn` and
# fstab, run `cairn install-helper --link` afterwards: the helpers then point at this copy.
install: build
	install -D -m 0755 $(RELEASE)/cairn $(DESTDIR)$(PREFIX)/bin/cairn
	@echo "installed $(DESTDIR)$(PREFIX)/bin/cairn"

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/cairn

# Mount an image in each mode, run a short metadata-heavy workload, print ops/s and device
# writes/flushes per operation, unmount, fsck.
demo: build
	@bash scripts/demo.sh

# fmt, clippy (warnings are errors), the whole workspace's tests including the heavy ones.
test: deps
	@bash scripts/test.sh

# The paper suite on every target; results/<timestamp>/ (docs/bench/how-to-run.md says how a
# run becomes docs/BENCHMARKS.md).
bench: build
	$(RELEASE)/cairn bench run --suite paper $(BENCH_ARGS)

# Fuzz each cargo-fuzz target for FUZZ_SECS seconds.
fuzz: deps
	@if [ ! -d fuzz ]; then echo "fuzz: no fuzz/ directory yet (cargo fuzz targets not written)"; exit 1; fi
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz
	@for t in $$(cd fuzz && $(CARGO) fuzz list); do \
		echo "== fuzz $$t ($(FUZZ_SECS) s)"; \
		RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run $$t -- -max_total_time=$(FUZZ_SECS) || exit 1; \
	done

# fstests (xfstests), the file-system community's suite, on cairn (scripts/fstests/run.sh,
# docs/CONFORMANCE.md): MODE= a mode of `cairn modes`, umbrella or ext4 (default softdep);
# GROUP= a group of the generic tests (default quick) or TESTS="generic/001 ..." or @smoke.
MODE ?=
GROUP ?=
TESTS ?=
fstests: deps
	@bash scripts/fstests/run.sh MODE="$(MODE)" GROUP="$(GROUP)" TESTS="$(TESTS)"

# A crash-consistency campaign over every mode (crates/crash, docs/CRASH.md).
crash: deps
	@if [ -d crates/crash ]; then $(CARGO) run --release -p cairn-cli --bin cairn -- crash run; \
	else echo "crash: the crash harness (crates/crash) is not written yet"; exit 1; fi
