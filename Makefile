# kvstash — thin wrapper over CMake. The two commands a newcomer needs:
#   make run    set up what is missing, build, and run the demo (MODEL=path.gguf to use yours)
#   make test   set up, build, and run every test (make test-asan: the same under ASan+UBSan)
# make fuzz runs each fuzz target for FUZZ_SECONDS (60) under ASan+UBSan (tests/fuzz/run.sh);
# make test-tsan runs the scheduler, store and server tests under ThreadSanitizer.
.PHONY: all setup clients build run test test-asan fuzz test-tsan bench soak clean demo-model install

BUILD      ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
TSAN_BUILD ?= build-tsan
JOBS       ?= $(shell nproc)
DEPS       := $(CURDIR)/build/deps
DEMO_MODEL := $(BUILD)/models/demo.gguf
MODEL      ?=
CTEST_ARGS ?=
# No suppressions: llama.cpp and ggml are not instrumented (ThreadSanitizer sees
# none of their accesses), and every report so far was a real race (docs/RELIABILITY.md).
TSAN_OPTIONS_KS = log_path=$(CURDIR)/$(TSAN_BUILD)/tsan/report second_deadlock_stack=1
PREFIX     ?= /usr/local
DESTDIR    ?=

all: build

setup:
	@bash scripts/setup.sh $(DEPS)

# The client SDKs of the end-to-end tests (tests/e2e/package.json, pinned by its lock file).
clients:
	@bash scripts/setup_clients.sh $(CURDIR)/build/e2e-npm

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKS_DEPS_DIR=$(DEPS) >/dev/null

build: setup $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# The demo model: the "bench" preset (compute like a real 0.5B model) unless MODEL= is given.
demo-model: build
	@if [ -z "$(MODEL)" ] && [ ! -f $(DEMO_MODEL) ]; then \
	  echo "make run: generating a random-weight demo model (no weights can be downloaded here)"; \
	  ./$(BUILD)/kvstash mkmodel --preset $${KS_DEMO_PRESET:-bench} --seed 1 $(DEMO_MODEL); fi

run: demo-model
	@bash scripts/run.sh ./$(BUILD)/kvstash "$(or $(MODEL),$(DEMO_MODEL))"

test: build clients
	cd $(BUILD) && ctest --output-on-failure --no-tests=error -j 2 $(CTEST_ARGS)

$(ASAN_BUILD)/CMakeCache.txt:
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKS_SANITIZE=ON -DKS_DEPS_DIR=$(DEPS) >/dev/null

test-asan: setup clients $(ASAN_BUILD)/CMakeCache.txt
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp:print_suppressions=0 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure --no-tests=error -j 2 $(CTEST_ARGS)

# The tests labelled tsan (CMakeLists.txt) under ThreadSanitizer. Every process writes
# its reports to $(TSAN_BUILD)/tsan/ (the servers of the e2e tests too, whose exit
# codes not every test checks): any report there fails the target.
$(TSAN_BUILD)/CMakeCache.txt:
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-O1 -g" \
	  -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" -DKS_TSAN=ON -DKS_DEPS_DIR=$(DEPS) >/dev/null

test-tsan: setup clients $(TSAN_BUILD)/CMakeCache.txt
	cmake --build $(TSAN_BUILD) -j $(JOBS)
	rm -rf $(TSAN_BUILD)/tsan && mkdir -p $(TSAN_BUILD)/tsan
	cd $(TSAN_BUILD) && TSAN_OPTIONS="$(TSAN_OPTIONS_KS)" ctest --output-on-failure --no-tests=error -j 2 -L tsan \
	  $(CTEST_ARGS); rc=$$?; \
	  if ls tsan/report.* >/dev/null 2>&1; then cat tsan/report.*; \
	    echo "make test-tsan: ThreadSanitizer reports in $(TSAN_BUILD)/tsan/ (above)"; rc=1; fi; exit $$rc

# libFuzzer needs clang (setup installs it); -O1 with asserts on, as libFuzzer advises.
$(FUZZ_BUILD)/CMakeCache.txt:
	CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-O1 -g" \
	  -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" -DKS_SANITIZE=ON -DKS_FUZZ=ON -DKS_DEPS_DIR=$(DEPS) >/dev/null

fuzz: setup $(FUZZ_BUILD)/CMakeCache.txt
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzzers
	KS_TEMPLATES_DIR=$(DEPS)/common/templates bash tests/fuzz/run.sh $(FUZZ_BUILD)

# make install [PREFIX=/usr/local] [DESTDIR=/staging/root]: bin/kvstash, the header,
# libkvstash.{a,so}, kvstash.pc and kvstash's private llama.cpp libraries (the layout
# is described in CMakeLists.txt). The installed tree needs no LD_LIBRARY_PATH.
install: build
	DESTDIR="$(DESTDIR)" cmake --install $(BUILD) --prefix "$(PREFIX)"

bench: build
	@bash bench/run_all.sh

# 64 streaming clients for 5 minutes on the tiny model (bench/soak/soak.mjs; SOAK_ARGS=--duration 60 ...).
soak: build
	@bash bench/soak/soak.sh $(SOAK_ARGS)

clean:
	rm -rf $(BUILD)/CMakeFiles $(BUILD)/kvstash $(ASAN_BUILD) $(FUZZ_BUILD) $(TSAN_BUILD)
