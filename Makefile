# lull: build, boot and test. `make run` and `make test` are the two set-up commands; both
# build everything they need on a fresh machine (apt packages via resources/ensure-apt.sh).

CARGO   ?= cargo
KIT     := $(CURDIR)/target/kit
GUEST   ?=
ARGS    ?=

.PHONY: all run test build build-release guests linux kit fmt-check clippy unit-tests \
        integration-tests bench-timer clean clean-kit help

all: build kit

help:
	@echo "make run            build lull and the kit, boot the default guest (Linux) on this terminal"
	@echo "make run GUEST=hello  boot a test guest from target/kit/guests instead"
	@echo "make test           format check, clippy, unit, property and integration tests"
	@echo "make guests|linux   build the guest kit (cached in \$$HOME/.cache/lull)"
	@echo "make bench-timer    timer crate benchmarks"

build:
	$(CARGO) build --workspace --all-targets

build-release:
	$(CARGO) build --release -p vmm

guests:
	resources/guests/build.sh $(KIT)/guests
	resources/guests/multiboot/build.sh $(KIT)/multiboot

linux:
	resources/linux/build.sh $(KIT)/linux

kit: guests linux

run: build-release kit
ifeq ($(GUEST),)
	target/release/lull run $(ARGS)
else
	target/release/lull run --kernel $(KIT)/guests/$(GUEST).elf $(ARGS)
endif

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

unit-tests:
	$(CARGO) test --workspace --exclude lull-tests

integration-tests: build kit
	LULL_BIN=$(CURDIR)/target/debug/lull LULL_KIT=$(KIT) $(CARGO) test -p lull-tests

test: fmt-check clippy unit-tests integration-tests

bench-timer:
	resources/bench/bench-timer.sh

clean:
	$(CARGO) clean

clean-kit:
	rm -rf $(KIT)
