#!/bin/sh
# GPU tests and benchmarks of the nccl transport, in one script for the
# device machine: builds (make), then runs build/tests/gpu-test.  Prints a
# skip message and exits 0 where there is no GPU, no CUDA/NCCL libraries or
# no headers.  Usage: sh tests/gpu/run.sh [BUILD_DIR]
set -u
BUILD=${1:-build}
REFIT_NO_DEPS=${REFIT_NO_DEPS:-1} make --no-print-directory "$BUILD/tests/gpu-test" >/dev/null || {
	echo "gpu: build failed"; exit 1; }
if ! command -v nvidia-smi >/dev/null 2>&1 && [ ! -e /dev/nvidia0 ]; then
	echo "gpu: skipped: no NVIDIA GPU on this machine (no nvidia-smi, no /dev/nvidia0)"
	exit 0
fi
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L
"$BUILD/tests/gpu-test"
rc=$?
if [ $rc -eq 77 ]; then
	exit 0
fi
exit $rc
