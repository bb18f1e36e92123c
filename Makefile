# Fathom's top-level commands. `make run` and `make test` work on a fresh Debian 12 machine:
# each installs what is missing (scripts/install-deps.sh), builds, then runs.
SHELL := /bin/bash
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
export CCACHE_DIR ?= $(HOME)/.cache/ccache
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1
# Expanded when a build directory is configured (`=`, not `:=`): on a fresh machine ccache is only
# there once `deps` has run, and a `:=` read at start-up configured the first build without it.
LAUNCHER = $(shell command -v ccache >/dev/null 2>&1 && echo -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
CTEST_J ?= $(JOBS)
FUZZ_SECONDS ?= 10
# Test labels `make test` leaves out: long suites have their own targets below.
SLOW_LABELS := large|slow|fuzz

.PHONY: all deps build run test test-unit test-fuzz test-asan test-tsan test-large test-slow fuzz bench format clean

all: build

deps:
	@scripts/install-deps.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(LAUNCHER) $(CMAKE_FLAGS)

build: deps $(BUILD)/build.ninja
	@cmake --build $(BUILD) -j $(JOBS)

# The main job: serve the built-in default model (see README).
run: build
	@scripts/run-default.sh

test: build
	@cd $(BUILD) && ctest -j $(CTEST_J) -LE '$(SLOW_LABELS)' --output-on-failure --timeout 900
	@$(MAKE) --no-print-directory test-fuzz FUZZ_SECONDS=$(FUZZ_SECONDS)

# libFuzzer targets (clang) for a bounded time each; `make fuzz` runs them longer.
test-fuzz: deps
	@cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
	  -DCMAKE_CXX_COMPILER=clang++ -DFATHOM_FUZZ=ON -DFATHOM_FUZZ_SECONDS=$(FUZZ_SECONDS) $(LAUNCHER) >/dev/null
	@cmake --build build-fuzz -j $(JOBS) --target fuzz_all
	@cd build-fuzz && ctest -j $(CTEST_J) -L fuzz --output-on-failure

fuzz:
	@$(MAKE) --no-print-directory test-fuzz FUZZ_SECONDS=600

test-asan: deps
	@cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFATHOM_SANITIZE=ON $(LAUNCHER) >/dev/null
	@cmake --build build-asan -j $(JOBS)
	@cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest -j $(CTEST_J) -LE '$(SLOW_LABELS)|noasan' --output-on-failure --timeout 1800

# ThreadSanitizer over the unit tests of the components that run threads (the thread pool and
# kernels, model, KV cache, engine, server, storage, EP, pipeline, trainer, agent).
TSAN_TESTS := base kernels model kvcache engine server storage ep pipeline train agent
test-tsan: deps
	@cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFATHOM_TSAN=ON $(LAUNCHER) >/dev/null
	@cmake --build build-tsan -j $(JOBS) --target $(addsuffix _test,$(TSAN_TESTS))
	@set -e; for t in $(TSAN_TESTS); do echo "== tsan: $${t}_test"; \
	  TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp halt_on_error=1 second_deadlock_stack=1" \
	  build-tsan/bin/$${t}_test --gtest_brief=1; done

# Full-size checkpoints and long soaks; they check free disk and memory first.
test-large: build
	@cd $(BUILD) && ctest -L large --output-on-failure --timeout 7200

test-slow: build
	@cd $(BUILD) && ctest -L slow --output-on-failure --timeout 7200

format:
	@find src bench tests -name '*.cpp' -o -name '*.h' | xargs clang-format -i

clean:
	rm -rf $(BUILD) build-asan build-fuzz
