# Thin wrapper over CMake for the README's commands.
#   make run    set up, build, and run the main training job
#   make test   set up, build, and run every test, and again under ASan+UBSan all but the
#               slow real-data training test, the mpirun test (Open MPI's own leaks), the Slurm cluster test
#               (its library code runs under the sanitizers in test_cluster) and the tests labelled
#               'heavy' (many multi-process trainings; their library code runs under the sanitizers
#               in the unit and lighter multirank tests); then each fuzz target for FUZZ_TEST_SECONDS
#               (when clang is installed). Keeps make test within 10 minutes on 2 cores, builds included.
#   make test-san-full   every test under ASan+UBSan, the heavy ones included (under 10 minutes on 2 cores)
#   make fuzz   build the libFuzzer targets (fuzz/, in build-fuzz/) and run each for FUZZ_SECONDS
BUILD ?= build
BUILD_SAN ?= build-san
BUILD_FUZZ ?= build-fuzz
JOBS ?= $(shell nproc)
# ctest runs one more test than there are cores: a quarter of the tests' time is spent waiting
# (timeouts proved, processes killed and restarted, a Slurm daemon starting), not computing
TEST_JOBS ?= $(shell echo $$(( $$(nproc) + 1 )))
RUN_ARGS ?=
FUZZ_SECONDS ?= 60
FUZZ_TEST_SECONDS ?= 2

.PHONY: all setup build build-san build-fuzz run test test-san-full fuzz clean

all: build

setup:
	@./scripts/setup.sh

build: setup
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# The sanitizer and fuzz builds leave the CUDA backend out: no GPU runs there, nvcc adds minutes to
# make test, and the built-without-CUDA paths get sanitized instead (the Release build has CUDA).
build-san: setup
	@cmake -S . -B $(BUILD_SAN) -DCMAKE_BUILD_TYPE=Debug -DTANDEM_SANITIZE=ON -DTANDEM_CUDA=OFF >/dev/null
	@cmake --build $(BUILD_SAN) -j $(JOBS)

# clang's libFuzzer; without it (clang and libclang-rt-14-dev on Debian 12) the fuzz targets are
# skipped, and their seeds still replay in the other builds' ctest
HAVE_LIBFUZZER = $(shell printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' | \
  clang -x c - -fsanitize=fuzzer -o /dev/null 2>/dev/null && echo yes)
build-fuzz: setup
	@TANDEM_SETUP_FUZZ=1 ./scripts/setup.sh
	@if [ "$(HAVE_LIBFUZZER)" = yes ]; then \
	  CC=clang cmake -S . -B $(BUILD_FUZZ) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_FUZZ=ON -DTANDEM_MPI=OFF -DTANDEM_CUDA=OFF \
	    -DTANDEM_FUZZ_SECONDS=$(FUZZ_TEST_SECONDS) >/dev/null && cmake --build $(BUILD_FUZZ) -j $(JOBS); \
	else echo "make: no clang with libFuzzer, so no fuzz targets (apt-get install clang libclang-rt-14-dev)"; fi

fuzz: build-fuzz
	fuzz/run.sh $(FUZZ_SECONDS) $(BUILD_FUZZ)/fuzz-work $(BUILD_FUZZ)/fuzz/fuzz_*

run: build
	./$(BUILD)/tandem run -n 2 -- tandem train --model mlp --data fashion-mnist --epochs 1 $(RUN_ARGS)

test: build build-san build-fuzz
	cd $(BUILD) && ctest --output-on-failure -j $(TEST_JOBS)
	cd $(BUILD_SAN) && ctest --output-on-failure -j $(TEST_JOBS) -LE heavy -E 'test_train$$|test_mpi|test_slurm'
	@if [ -d $(BUILD_FUZZ)/fuzz ]; then cd $(BUILD_FUZZ) && ctest --output-on-failure -j $(TEST_JOBS); fi

test-san-full: build-san
	cd $(BUILD_SAN) && TANDEM_TEST_FULL=1 ctest --output-on-failure -j $(TEST_JOBS) -E 'test_mpi|test_slurm'

clean:
	rm -rf $(BUILD) $(BUILD_SAN) $(BUILD_FUZZ)
