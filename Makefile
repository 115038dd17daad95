# lull: build, boot and test. `make run` and `make test` are the two set-up commands; both
# build everything they need on a fresh machine (apt packages via resources/ensure-apt.sh).

CARGO   ?= cargo
KIT     := $(CURDIR)/target/kit
GUEST   ?=
ARGS    ?=

.PHONY: all run test build build-release guests linux kit libvirt fmt-check clippy check-cycles \
        unit-tests loom-tests integration-tests bench-timer clean clean-kit help

all: build kit

help:
	@echo "make run            build lull and the kit, boot the default guest (Linux) on this terminal"
	@echo "make run GUEST=hello  boot a test guest from target/kit/guests instead"
	@echo "make test           format check, clippy, import cycles, unit, property, loom and integration tests"
	@echo "make check-cycles   no file- or module-level import cycle in the crates, no import up vmm's layers"
	@echo "make loom-tests     the timer crate's loom models (LOOM_MAX_PREEMPTIONS=N searches deeper)"
	@echo "make guests|linux   build the guest kit (cached in \$$HOME/.cache/lull)"
	@echo "make libvirt        libvirt's virtchd (Cloud Hypervisor driver), virsh, virtlogd from Debian's source (cached)"
	@echo "make bench-timer    timer crate benchmarks"
	@echo "make bench          lull bench density and wakeup, results in docs/bench/"
	@echo "make bench-timer-modes|bench-latency|bench-idle-manager|bench-boot|bench-linux|bench-snapshot|bench-clones|bench-clone-density  the other lull bench experiments"
	@echo "make bench-floor    the least a user-space LAPIC's timer event and IPI wake-up cost here, against KVM's"
	@echo "make fuzz           run every fuzz target for FUZZ_TIME seconds (default 600 each)"

build:
	$(CARGO) build --workspace --all-targets

build-release:
	$(CARGO) build --release -p lull

guests:
	resources/guests/build.sh $(KIT)/guests
	resources/guests/multiboot/build.sh $(KIT)/multiboot

linux:
	resources/linux/build.sh $(KIT)/linux

kit: guests linux

# libvirt with its Cloud Hypervisor driver, for tests/tests/libvirt.rs (resources/libvirt/;
# about 4 minutes cold on 2 cores, then a cache hit).
libvirt:
	resources/libvirt/build.sh $(CURDIR)/target/libvirt

run: build-release kit
ifeq ($(GUEST),)
	@# The kit's Linux: its shell where guest user space runs (the reset when it exits: 0); on
	@# PVM hosts its in-kernel idle workload (cmdline.pvm), whose PASS writes 0 to the test-exit
	@# port (status 1), FAIL 1 (3), and a panic 2 (5).
	target/release/lull run $(ARGS); \
	    status=$$?; [ $$status -le 1 ] || { echo "lull exited with status $$status"; exit $$status; }
else
	@# A test guest that passes writes 0 to the test-exit port: lull exits with status 1.
	target/release/lull run --kernel $(KIT)/guests/$(GUEST).elf $(ARGS); \
	    status=$$?; [ $$status -eq 1 ] || { echo "lull exited with status $$status"; exit $$status; }
endif

# fuzz/ is outside the workspace (its own Cargo.lock): each gate runs there too. A plain build
# (no sanitizer flags, hence no RUSTC_BOOTSTRAP) in target/fuzz, next to cargo-fuzz's.
FUZZ_CHECK := cd fuzz && CARGO_TARGET_DIR=$(CURDIR)/target/fuzz

fmt-check:
	$(CARGO) fmt --all -- --check
	$(FUZZ_CHECK) $(CARGO) fmt -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(FUZZ_CHECK) $(CARGO) clippy --all-targets -- -D warnings

# No file-level import cycle (a module's file and its children, siblings) in any crate, but in
# the modules resources/check_cycles.allow lists; no cycle between a crate's top-level modules,
# and no import up the `layers:` line of vmm/src/lib.rs (resources/check_layers.py). The
# checks' own tests first.
CYCLE_CRATES := vmm/src lull/src bench/src devices/src timer/src schema/src kit/src tests/src fuzz/src
check-cycles:
	python3 resources/test_check_cycles.py
	python3 resources/check_cycles.py --allow resources/check_cycles.allow $(CYCLE_CRATES)

# Unit and property tests; in fuzz/, the replay of fuzz/regressions/ through every driver.
unit-tests:
	$(CARGO) test --workspace --exclude lull-tests
	$(FUZZ_CHECK) $(CARGO) test

# The timer crate's loom models (timer/tests/loom*.rs and the crate's `loom_tests` modules;
# a test runs here if its name holds `loom_`): every interleaving of the lock-free state and of
# the pull model's wake-up hand-over, up to LOOM_MAX_PREEMPTIONS preemptions per execution.
# `--cfg loom` swaps the crate's atomics and locks for loom's, so the step builds in its own
# target dir, with a release profile of its own: no LTO, and only the crates the models run
# through optimised (the timer crate, loom and what loom's scheduler runs on), not the other
# dev-dependencies (criterion, proptest). Bound 5: 3m47s for the whole step from a clean
# target/loom on a loaded host (1m42s of CPU, 7.5 s of it model checking); bound 6 checks
# about 4x longer.
LOOM_MAX_PREEMPTIONS ?= 5
LOOM_PROFILE := --config 'profile.release.lto=false' --config 'profile.release.codegen-units=16' \
    --config 'profile.release.debug=0' --config 'profile.release.package."*".opt-level=0' \
    $(foreach c,loom generator scoped-tls tracing tracing-core, \
        --config 'profile.release.package.$(c).opt-level=3')
loom-tests:
	RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=$(CURDIR)/target/loom \
	    LOOM_MAX_PREEMPTIONS=$(LOOM_MAX_PREEMPTIONS) $(CARGO) test $(LOOM_PROFILE) -p timer \
	    --release --lib --test loom --test loom_retarget -- loom_

integration-tests: build kit libvirt
	@# mkfs.ext4 and e2fsck for the Linux root-disk test (tests/tests/virtio_blk.rs); ip
	@# (network namespaces, taps) and ping for the virtio-net tests (tests/tests/virtio_net.rs).
	resources/ensure-apt.sh e2fsprogs iproute2 iputils-ping
	LULL_BIN=$(CURDIR)/target/debug/lull LULL_KIT=$(KIT) LULL_LIBVIRT=$(CURDIR)/target/libvirt \
	    $(CARGO) test -p lull-tests

test: fmt-check clippy check-cycles unit-tests loom-tests integration-tests fuzz-smoke

bench-timer:
	resources/bench/bench-timer.sh

clean:
	$(CARGO) clean

clean-kit:
	rm -rf $(KIT)

# Fuzzing (fuzz/, a cargo-fuzz crate outside the workspace; see docs/RELIABILITY.md). cargo-fuzz
# passes nightly-only flags (sanitizer, coverage); RUSTC_BOOTSTRAP=1 lets the stable toolchain
# accept them. `make fuzz` runs each target FUZZ_TIME seconds; `make test` a FUZZ_SMOKE_TIME
# smoke of each. A crash stops the run and leaves its input in fuzz/artifacts/<target>/.
# An input that runs past FUZZ_INPUT_TIMEOUT seconds fails too: `lapic_idle` blocks (hangs)
# rather than panics if the chip holds a vCPU the target did not predict.
FUZZ_TIME          ?= 600
FUZZ_SMOKE_TIME    ?= 20
FUZZ_INPUT_TIMEOUT ?= 30
FUZZ_TARGETS       ?= lapic lapic_idle ioapic serial timer loader cli api virtio_blk virtio_net snapshot
FUZZ_ENV        := RUSTC_BOOTSTRAP=1 CARGO_TARGET_DIR=$(CURDIR)/target/fuzz

.PHONY: fuzz fuzz-smoke fuzz-tool

fuzz-tool:
	@$(CARGO) fuzz --version >/dev/null 2>&1 || $(CARGO) install cargo-fuzz --locked

fuzz: fuzz-tool
	cd fuzz && for t in $(FUZZ_TARGETS); do \
	  $(FUZZ_ENV) $(CARGO) fuzz run $$t -- -max_total_time=$(FUZZ_TIME) \
	    -timeout=$(FUZZ_INPUT_TIMEOUT) || exit 1; done

fuzz-smoke: fuzz-tool
	cd fuzz && $(FUZZ_ENV) $(CARGO) fuzz build
	mkdir -p target/fuzz
	cd fuzz && for t in $(FUZZ_TARGETS); do \
	  log=$(CURDIR)/target/fuzz/smoke-$$t.log; \
	  if $(FUZZ_ENV) $(CARGO) fuzz run $$t -- -max_total_time=$(FUZZ_SMOKE_TIME) \
	      -timeout=$(FUZZ_INPUT_TIMEOUT) >$$log 2>&1; \
	  then echo "fuzz $$t: `grep -E '^Done [0-9]+ runs' $$log`"; \
	  else tail -40 $$log; echo "fuzz $$t: FAILED (input in fuzz/artifacts/$$t/)"; exit 1; fi; \
	done

# lull bench: density (lull's modes and QEMU side by side), global-timer load, wake-up latency.
# Tables, JSON and the plot land in docs/bench/ (read in docs/PERFORMANCE.md).
.PHONY: bench
bench: build-release guests
	mkdir -p docs/bench
	LULL_KIT=$(KIT) target/release/lull bench density --vms 1,8,32,64 --cpus 2 --duration 30s \
	    --json docs/bench/density.json --plot docs/bench/density.svg | tee docs/bench/density.txt
	LULL_KIT=$(KIT) target/release/lull bench global-timers --duration 10s --global-timers 4 \
	    --json docs/bench/global-timers.json | tee docs/bench/global-timers.txt
	LULL_KIT=$(KIT) target/release/lull bench wakeup --json docs/bench/wakeup.json \
	    | tee docs/bench/wakeup.txt

# The other experiments of lull bench (docs/PERFORMANCE.md has a section for each).
.PHONY: bench-timer-modes bench-latency bench-idle-manager bench-boot bench-linux bench-snapshot \
        bench-clones bench-clone-density
bench-timer-modes: build-release guests
	mkdir -p docs/bench
	LULL_KIT=$(KIT) target/release/lull bench timer-modes --count 200 --reps 3 \
	    --json docs/bench/timer-modes.json | tee docs/bench/timer-modes.txt

# Short deadlines re-armed from the guest's handler (halted and busy, PV EOI off and on): about
# 16 runs of 5 s per rep, ~5 minutes.
bench-latency: build-release guests
	mkdir -p docs/bench
	LULL_KIT=$(KIT) target/release/lull bench latency --duration 5s --reps 3 \
	    --json docs/bench/latency.json | tee docs/bench/latency.txt

bench-idle-manager: build-release guests
	mkdir -p docs/bench
	LULL_KIT=$(KIT) target/release/lull bench idle-manager --duration 3s \
	    --json docs/bench/idle-manager.json | tee docs/bench/idle-manager.txt

bench-boot: build-release kit
	mkdir -p docs/bench
	LULL_KIT=$(KIT) target/release/lull bench boot --reps 5 --linux-reps 3 \
	    --json docs/bench/boot.json | tee docs/bench/boot.txt

# Pause/resume latency, snapshot time and size, restore-to-running (issue 31's figures): 2 vCPUs,
# 256 MiB, 1,000 pause/resume cycles and 5 restores per path; each restored guest runs to its
# end (about 10 s each: 2-3 minutes per mode with a restore, less without).
bench-snapshot: build-release guests
	mkdir -p docs/bench
	LULL_KIT=$(KIT) target/release/lull bench snapshot --cpus 2 --memory 256M --reps 1000 \
	    --restores 5 --count 300 --modes kernel,pull,central \
	    --json docs/bench/snapshot.json | tee docs/bench/snapshot.txt

# Fleets of the kit's Linux restored from one snapshot (issue 43): per mode one boot (30-400 s
# here), restores by mapping and by copy, then 8, 64 and 256 clones at once, each left a minute.
bench-clones: build-release kit
	mkdir -p docs/bench
	LULL_KIT=$(KIT) target/release/lull bench clones --modes kernel,pull --timer-slack 1ms \
	    --clones 8,64,256 --fleet-memory map --restores 5 \
	    --json docs/bench/clones.json | tee docs/bench/clones.txt

# The density bench on fleets of Linux clones (issue 43): per mode (pull with and without a
# 1 ms slack) one boot and one snapshot, then 128 clones of 1 vCPU running the timers workload,
# their lateness, CPU and host wake-ups after their own restores; and 256 idle ones.
bench-clone-density: build-release kit
	mkdir -p docs/bench
	LULL_KIT=$(KIT) target/release/lull bench density --guest linux --clones --cpus 1 \
	    --memory 64M --vms 128 --workload timers --modes kernel,pull --timer-slack off,1ms \
	    --duration 20s --json docs/bench/clone-density.json | tee docs/bench/clone-density.txt
	LULL_KIT=$(KIT) target/release/lull bench density --guest linux --clones --cpus 1 \
	    --memory 64M --vms 256 --workload idle --modes kernel,pull --duration 20s \
	    --json docs/bench/clone-density-idle.json | tee docs/bench/clone-density-idle.txt

# The floor: a timer event and an IPI wake-up with the LAPIC in user space at their cheapest
# (no VMM: resources/bench/floor.c), against KVM's LAPIC, interleaved (about 8 minutes with the
# default 10 s per run; docs/PERFORMANCE.md, "The floor of a user-space LAPIC on this host").
FLOOR_SECONDS ?= 10
FLOOR_OUT     ?= docs/bench/floor.txt
.PHONY: bench-floor
bench-floor:
	mkdir -p target $(dir $(FLOOR_OUT))
	gcc -O2 -Wall -Wextra -Werror -pthread -o target/floor resources/bench/floor.c
	: > $(FLOOR_OUT); run() { out=$$(target/floor "$$@") || exit 1; echo "$$out" | tee -a $(FLOOR_OUT); }; \
	for iv in 1000 10000 100000; do for r in 1 2 3 4; do for m in kernel user-msr user-pv; do \
	  run $$m $$iv $(FLOOR_SECONDS); done; done; done; \
	for r in 1 2 3 4; do for d in 1 50; do for m in ipi-kernel ipi-user ipi-user-poll; do \
	  run $$m $$d $(FLOOR_SECONDS); done; done; done

# The kit's Linux in the density experiment: 4 VMs x 2 vCPUs, both workloads, every lull mode
# (the kernels boot one after the other: about 4 minutes per mode with the idle workload, 9 with
# the timers one, whose running guests take about one of the 2 host cores and slow the later
# boots to 30-100 s each, hence its longer --boot-spread).
bench-linux: build-release kit
	mkdir -p docs/bench
	LULL_KIT=$(KIT) target/release/lull bench density --guest linux --vms 4 --cpus 2 \
	    --duration 60s --boot-spread 90s --modes kernel,pull,push,central --workload idle \
	    --json docs/bench/linux-density.json --plot docs/bench/linux-density.svg \
	    | tee docs/bench/linux-density.txt
	LULL_KIT=$(KIT) target/release/lull bench density --guest linux --vms 4 --cpus 2 \
	    --duration 60s --boot-spread 330s --modes kernel,pull,push,central --workload timers \
	    --json docs/bench/linux-density-timers.json --plot docs/bench/linux-density-timers.svg \
	    | tee docs/bench/linux-density-timers.txt
