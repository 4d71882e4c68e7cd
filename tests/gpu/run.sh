#!/bin/sh
# The nccl transport on a real GPU, in one script for the device machine:
# builds (make all: refitd, refit-client, the test program, and the
# strided-copy kernel with nvcc), then runs
#   1. build/tests/gpu-test: box copies (kernel, size-1 and stride-0 dims),
#      a failed copy caught at sync, CUDA IPC at offsets (2 MiB
#      allocations; a cuda_bytes past the mapping refused by
#      cuMemGetAddressRange), three processes with a ring and a shrink, a
#      loopback communicator (GB/s), a refused ncclGroupStart and a host
#      copy that never ends (stand-ins in the loaded table; the real
#      ncclCommAbort, cudaMallocHost and poisoning run);
#   2. tests/gpu/test_gpu_e2e.py: three refitd node daemons sharing the
#      GPU (NCCL_HOSTID per daemon, NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1:
#      NCCL's socket transport), librefit clients with GPU memory, refits
#      with verify on, an abort, a node kill, a shrink.
# Where no GPU exists it says so and counts nothing ("gpu: 0 passed, 0
# failed", exit 0).  Where a GPU exists, a missing driver, CUDA runtime,
# NCCL or nvcc is a FAILURE, not a skip.  Ends with "gpu: N passed, N failed".
# Usage: sh tests/gpu/run.sh [BUILD_DIR]
set -u
BUILD=${1:-build}
pass=0
fail=0
if ! command -v nvidia-smi >/dev/null 2>&1 && [ ! -e /dev/nvidia0 ]; then
	echo "gpu: skipped: no NVIDIA GPU on this machine (no nvidia-smi, no /dev/nvidia0)"
	echo "gpu: 0 passed, 0 failed"
	exit 0
fi
finish() {
	echo "gpu: $pass passed, $fail failed"
	[ "$fail" -eq 0 ]
	exit $?
}
if ! nvidia-smi -L; then
	echo "FAIL a GPU device node exists but nvidia-smi fails: is the driver loaded?"
	fail=$((fail + 1))
	finish
fi
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [ ! -x "$CUDA_HOME/bin/nvcc" ]; then
	echo "FAIL no nvcc at $CUDA_HOME/bin/nvcc: the strided-copy kernel cannot be built"
	fail=$((fail + 1))
fi
mkdir -p "$BUILD"
if ! REFIT_NO_DEPS=${REFIT_NO_DEPS:-1} make --no-print-directory -j"$(nproc)" all \
	BUILD="$BUILD" >"$BUILD/gpu-build.log" 2>&1; then
	tail -30 "$BUILD/gpu-build.log"
	echo "FAIL the build"
	fail=$((fail + 1))
	finish
fi
# the kernel built here, the CUDA runtime and NCCL found as refitd finds them
export REFIT_GPU_KERNELS_LIBRARY=${REFIT_GPU_KERNELS_LIBRARY:-$(pwd)/$BUILD/lib/librefit-gpu-kernels.so}
if [ ! -f "$REFIT_GPU_KERNELS_LIBRARY" ]; then
	echo "FAIL no kernel library $REFIT_GPU_KERNELS_LIBRARY"
	fail=$((fail + 1))
fi

echo "== gpu-test"
timeout 600 "$BUILD/tests/gpu-test"
rc=$?
case $rc in
0) pass=$((pass + 1)) ;;
77) echo "FAIL gpu-test skipped on a machine with a GPU (driver or library missing)"
    fail=$((fail + 1)) ;;
*) echo "FAIL gpu-test exited $rc"; fail=$((fail + 1)) ;;
esac

echo "== three refitd node daemons sharing the GPU"
out=$(REFIT_TEST_TRANSPORT=nccl REFIT_TEST_GPU=1 timeout 600 /usr/bin/python3 \
	tests/gpu/test_gpu_e2e.py "$BUILD" 2>&1)
rc=$?
echo "$out"
line=$(echo "$out" | grep -E "^gpu-e2e: [0-9]+ passed, [0-9]+ failed" | tail -1)
if [ $rc -eq 0 ] && [ -n "$line" ]; then
	pass=$((pass + 1))
else
	echo "FAIL gpu e2e exited $rc"
	fail=$((fail + 1))
fi
finish
