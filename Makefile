# Thin wrapper over CMake for the README's two commands.
#   make run    set up, build, and run the main training job
#   make test   set up, build, and run every test, and again under ASan+UBSan all but the
#               slow real-data training test and the mpirun test (Open MPI's own leaks)
BUILD ?= build
BUILD_SAN ?= build-san
JOBS ?= $(shell nproc)
RUN_ARGS ?=

.PHONY: all setup build build-san run test test-san clean

all: build

setup:
	@./scripts/setup.sh

build: setup
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

build-san: setup
	@cmake -S . -B $(BUILD_SAN) -DCMAKE_BUILD_TYPE=Debug -DTANDEM_SANITIZE=ON >/dev/null
	@cmake --build $(BUILD_SAN) -j $(JOBS)

run: build
	./$(BUILD)/tandem run -n 2 -- tandem train --model mlp --data fashion-mnist --epochs 1 $(RUN_ARGS)

test: build build-san
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	cd $(BUILD_SAN) && ctest --output-on-failure -j $(JOBS) -E 'test_train|test_mpi'

clean:
	rm -rf $(BUILD) $(BUILD_SAN)
