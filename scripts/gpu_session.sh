#!/usr/bin/env bash
# One pass of the GPU checks on a machine with an NVIDIA GPU (the lent device machine, or any):
# build the CUDA backend, run the GPU tests, the kernel floors and tandem's GPT-2 step against
# PyTorch on the same GPU, then compute-sanitizer's memcheck on the kernel tests. Every step runs
# even when one before it fails; the log goes to stdout and, when OUT is set, to $OUT/gpu.log.
#
#   scripts/gpu_session.sh [REPS=2 (0: no PyTorch comparison)]         env: BUILD=build-gpu, SANITIZE=1, BENCH=1, FORCE_DEVDEPS=1 (use .devdeps/)
#
# Build dependencies: OpenBLAS and zlib headers. A machine without them (the device image has no
# package registry) can take Debian's packages unpacked from .devdeps/ (apt-get download
# libopenblas0-pthread libopenblas-pthread-dev libgfortran5 zlib1g-dev into it, here).
set -u
cd "$(dirname "$0")/.."
REPS=${1:-2}
BUILD=${BUILD:-build-gpu}
LOG=${OUT:-/tmp}/gpu.log
exec > >(tee "$LOG") 2>&1
step() { echo; echo "=== $* ($(date +%T))"; }

step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
nvcc --version 2>/dev/null | tail -1 || /usr/local/cuda/bin/nvcc --version | tail -1
python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)' 2>/dev/null
nproc

EXTRA=()
CFLAGS_EXTRA=""
have_blas() {
  [[ -z ${FORCE_DEVDEPS:-} ]] && ldconfig -p | grep -q 'libopenblas\.so ' &&
    { compgen -G "/usr/include/cblas.h" >/dev/null || compgen -G "/usr/include/*/cblas.h" >/dev/null; }
}
have_zlib() { [[ -z ${FORCE_DEVDEPS:-} && -e /usr/include/zlib.h ]]; }
if ! have_blas || ! have_zlib; then
  if compgen -G ".devdeps/*.deb" >/dev/null; then
    step "unpacking .devdeps (OpenBLAS or zlib's header missing here)"
    D=/tmp/devdeps LIB=/tmp/devdeps/usr/lib/x86_64-linux-gnu
    mkdir -p $D
    for f in .devdeps/*.deb; do dpkg -x "$f" $D; done
    if ! have_blas; then
      export LD_LIBRARY_PATH=$LIB/openblas-pthread:$LIB:${LD_LIBRARY_PATH:-}
      EXTRA+=(-DOPENBLAS_LIB=$LIB/openblas-pthread/libopenblas.so)
      CFLAGS_EXTRA="-I$D/usr/include/x86_64-linux-gnu/openblas-pthread"
    fi
    if ! have_zlib; then
      EXTRA+=(-DZLIB_INCLUDE_DIR=$D/usr/include "-DZLIB_LIBRARY=$(ldconfig -p | awk '/libz\.so\.1 /{print $NF; exit}')")
    fi
  else
    echo "no OpenBLAS or zlib header here and no .devdeps/ to unpack: the build will fail"
  fi
fi

step "build ($BUILD)"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=ON -DTANDEM_MPI=OFF "-DCMAKE_C_FLAGS=$CFLAGS_EXTRA" \
  ${EXTRA[@]+"${EXTRA[@]}"} >"${OUT:-/tmp}/cmake.log" 2>&1 ||
  { cat "${OUT:-/tmp}/cmake.log"; exit 1; }
grep -E "tandem:" "${OUT:-/tmp}/cmake.log"
cmake --build "$BUILD" -j "$(nproc)" --target tandem_cli test_cuda_kernels test_cuda_gpt cuda_kernels_bench 2>&1 |
  grep -E "error|warning: |Error" | head -40
[[ -x $BUILD/tandem ]] || { echo "build failed"; exit 1; }

step "GPU tests"
(cd "$BUILD" && ctest -L cuda --output-on-failure -V 2>&1 | grep -vE "^[0-9]+: Test command|^UpdateCTestConfiguration|^Parse|^ Add file|^Constructing|^Checking|^Test project|^test [0-9]+$|^ *Start")

if [[ ${BENCH:-1} == 1 ]]; then
  step "kernels against their floors"
  "$BUILD/bench/cuda_kernels"
  step "tandem's GPT-2 step, bf16 (breakdown)"
  "$BUILD/tandem" bench gpt --device cuda --config gpt2-124M --batch-size 16 --seq-len 1024 --steps 8 --warmup 2 --precision bf16 --profile
  if [[ $REPS -gt 0 ]]; then
    step "GPT-2 124M against PyTorch, $REPS alternating runs"
    BUILD=$BUILD bench/gpt_cuda_vs_pytorch.sh "$REPS" 16 1024 8
  fi
fi

if [[ ${SANITIZE:-1} == 1 ]]; then
  step "compute-sanitizer memcheck: test_cuda_kernels"
  timeout 240 compute-sanitizer --tool memcheck --print-limit 20 "$BUILD/tests/test_cuda_kernels" 2>&1 | tail -25
fi
step "done"
