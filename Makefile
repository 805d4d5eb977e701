# The front door. `make run` boots the demo guest; `make test` is what CI runs.
SHELL := /bin/bash
.DEFAULT_GOAL := help

GUEST_TARGET := x86_64-unknown-none
GUEST_DIR    := guest-tests
GUEST_OUT    := $(GUEST_DIR)/target/$(GUEST_TARGET)/release
VMM          := target/release/vmm
# Flags for `make run`; VMM_ARGS come last, so they override these.
DEMO_ARGS    ?= --cpu-model icelake-server --pmu-backend precise --dump-pebs --timeout 120
VMM_ARGS     ?=

.PHONY: help deps guests build run test fmt-check clippy unit bench fuzz

help:
	@echo "make run     boot the demo guest with virtual PEBS (VMM_ARGS=... adds vmm run flags)"
	@echo "make test    format check, clippy -D warnings, unit tests, guest tests, Linux guest (skylake)"
	@echo "make guests  build the no_std guest programs"
	@echo "make bench   benchmarks (see README)"
	@echo "make linux-guest  build the guest Linux kernel (resources/linux-guest/; first build ~6 min)"
	@echo "make linux-test   boot it on every PEBS model and run its perf self-test"
	@echo "make fuzz    run the libFuzzer targets FUZZ_SECS (60) s each (installs nightly + cargo-fuzz)"

# Everything a fresh machine needs beyond the Rust toolchain.
deps:
	@command -v cargo >/dev/null || { echo "error: cargo not found; install Rust with rustup (https://rustup.rs)" >&2; exit 1; }
	@if ! rustup target list --installed 2>/dev/null | grep -qx $(GUEST_TARGET); then \
	  echo "installing the $(GUEST_TARGET) target for the guest programs"; \
	  rustup target add $(GUEST_TARGET) || { echo "error: 'rustup target add $(GUEST_TARGET)' failed; guests cannot be built without it" >&2; exit 1; }; \
	fi
	@command -v objcopy >/dev/null || { \
	  echo "installing binutils (objcopy makes the ELF32 multiboot test kernel)"; \
	  (apt-get update -qq && apt-get install -y -qq binutils) || { echo "error: objcopy is missing and apt-get could not install binutils; install it by hand" >&2; exit 1; }; }
	@[ -r /dev/kvm ] || echo "warning: /dev/kvm is not accessible: guests will not boot (run as root or join the kvm group)" >&2

guests: deps
	cargo build --release --manifest-path $(GUEST_DIR)/Cargo.toml --target $(GUEST_TARGET)

build: deps
	cargo build --release -p vmm

run: guests build
	$(VMM) run --kernel $(GUEST_OUT)/demo $(DEMO_ARGS) $(VMM_ARGS)

fmt-check:
	cargo fmt --all --check
	cd $(GUEST_DIR) && cargo fmt --check

clippy: deps
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy --release --manifest-path $(GUEST_DIR)/Cargo.toml --target $(GUEST_TARGET) -- -D warnings

unit: deps
	cargo test --workspace

test: deps fmt-check clippy linux-guest unit

# Fuzzing (see fuzz/Cargo.toml): each libFuzzer target for FUZZ_SECS seconds, with overflow
# checks, seeded from fuzz/corpus/<target>/ (traces from `vmm run --trace-msr` dropped into
# fuzz/corpus/msr_traps/ are seeds too). New inputs go to fuzz/corpus-run/, crashes to
# fuzz/artifacts/, libFuzzer's logs to fuzz/artifacts/<target>.log.
FUZZ_SECS    ?= 60
FUZZ_TARGETS := msr_traps pebs_records page_walk

fuzz:
	@command -v rustup >/dev/null || { echo "error: rustup not found; cargo-fuzz needs a nightly toolchain installed through rustup (https://rustup.rs)" >&2; exit 1; }
	@rustup toolchain list | grep -q '^nightly' || { \
	  echo "installing the nightly toolchain (cargo-fuzz needs -Zsanitizer flags)"; \
	  rustup toolchain install nightly --profile minimal || { echo "error: 'rustup toolchain install nightly' failed; install a nightly toolchain to run the fuzzers (stable 'cargo test -p vpmu --test fuzz_corpus' runs the same logic without libFuzzer)" >&2; exit 1; }; }
	@cargo fuzz --version >/dev/null 2>&1 || { \
	  echo "installing cargo-fuzz"; \
	  cargo install cargo-fuzz --locked || { echo "error: 'cargo install cargo-fuzz' failed; install it by hand to run the fuzzers" >&2; exit 1; }; }
	@mkdir -p fuzz/artifacts; failed=""; \
	for t in $(FUZZ_TARGETS); do \
	  mkdir -p fuzz/corpus-run/$$t; \
	  echo "fuzzing $$t for $(FUZZ_SECS) s"; \
	  cargo +nightly fuzz run --fuzz-dir fuzz -s none -a $$t fuzz/corpus-run/$$t fuzz/corpus/$$t -- \
	    -max_total_time=$(FUZZ_SECS) -print_final_stats=1 > fuzz/artifacts/$$t.log 2>&1 || failed="$$failed $$t"; \
	  grep -E '^(Done|stat::number_of_executed_units)' fuzz/artifacts/$$t.log | tail -1 | sed "s/^/  $$t: /"; \
	done; \
	if [ -n "$$failed" ]; then echo "error: fuzz targets failed:$$failed (see fuzz/artifacts/<target>.log and the crash inputs there)" >&2; exit 1; fi; \
	echo "fuzzing done: no invariant violated"

# Guest Linux kernel from Debian's linux-source-6.12 (resources/linux-guest/README.md), built in
# target/linux-guest/; rebuilds are incremental. linux-test boots it on each preset CPU model
# with PEBS (fmt0-fmt5) and requires the kernel's own perf driver and self-test to pass. `make
# test` builds the kernel too, and its `cargo test` boots skylake only (VMM_LINUX_MODELS unset);
# without a built kernel, vmm/tests/linux.rs skips.
.PHONY: linux-guest linux-test
linux-guest:
	bash resources/linux-guest/build.sh

linux-test: deps linux-guest
	VMM_LINUX_MODELS=all cargo test -p vmm --test linux -- --nocapture

# Benchmarks (README "Performance"): vpmu handler, assist and page-walk times with criterion,
# then the end-to-end figures through the bench guest; one table, also in target/bench/results.json.
BENCH_CRITERION ?= --measurement-time 1 --warm-up-time 0.4
bench: guests
	cargo bench -p vpmu --bench vpmu -- $(BENCH_CRITERION) > /dev/null
	cargo bench -p vmm --bench e2e
