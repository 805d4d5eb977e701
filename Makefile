# The front door. `make run` boots the demo guest; `make test` is what CI runs.
SHELL := /bin/bash
.DEFAULT_GOAL := help

GUEST_TARGET := x86_64-unknown-none
GUEST_DIR    := guest-tests
GUEST_OUT    := $(GUEST_DIR)/target/$(GUEST_TARGET)/release
VMM          := target/release/vmm
# Flags for `make run`; VMM_ARGS come last, so they override these.
DEMO_ARGS    ?= --cpu-model icelake-server --pmu-backend precise --timeout 120
VMM_ARGS     ?=

.PHONY: help deps guests build run test fmt-check clippy unit bench fuzz

help:
	@echo "make run     boot the demo guest with virtual PEBS (VMM_ARGS=... adds vmm run flags)"
	@echo "make test    format check, clippy -D warnings, unit tests, guest tests"
	@echo "make guests  build the no_std guest programs"
	@echo "make bench   benchmarks (see README)"

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

test: deps fmt-check clippy unit
