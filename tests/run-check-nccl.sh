#!/bin/sh
# `make check-nccl`: the nccl transport on the CUDA + NCCL emulator.
#   1. the emulator's own rule tests (tests/run-check-emu.sh);
#   2. the GPU test program (tests/gpu/gpu_test.c) over the emulator: box
#      copies (the strided-copy kernel, size-1 and stride-0 dims), copy
#      errors surfacing at sync, IPC offsets, per-device staging, grouped
#      send/recv between processes and a shrink;
#   3. the data-plane end-to-end suite and the fault suite with
#      REFIT_TEST_TRANSPORT=nccl (node daemons on emulated hosts with 4
#      devices each, clients registering GPU memory by CUDA IPC handle,
#      the emulator's leak counters checked after each suite), and the
#      GPU machine's e2e script (tests/gpu/test_gpu_e2e.py) on the emulator;
#      a poisoned node (tests/integration/test_poison.py: a copy to the host
#      that never ends, REFIT_EMU_HANG_D2H); the conversion kernels' launcher
#      against the host quantizer (cvt-gpu-test) and a converting model over
#      nccl, every byte against the numpy reference (test_conversion.py);
# 2 and 3 once with the normal build and once under ASan + UBSan.
# Ends with "check-nccl: N passed, N failed".
# Usage: sh tests/run-check-nccl.sh [BUILD_DIR]  (NCCL_PAIRS, NCCL_SOAK, NCCL_ASAN_PAIRS)
set -u
BUILD=${1:-build}
PAIRS=${NCCL_PAIRS:-20}
SOAK=${NCCL_SOAK:-10}
ASAN_PAIRS=${NCCL_ASAN_PAIRS:-6}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$(pwd)/tests/lsan.supp}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
CHECK_DIR=$BUILD/check-nccl
CHECK_LOG=$BUILD/check-nccl.log
mkdir -p "$CHECK_DIR" && rm -f "$CHECK_DIR"/suite-*.log && : >"$CHECK_LOG" || exit 1
. tests/check-lib.sh

script "emulator rule tests (tests/run-check-emu.sh)" sh tests/run-check-emu.sh "$BUILD"
EMU=$(cd "$BUILD/emu" 2>/dev/null && pwd) || EMU=""
if [ -z "$EMU" ] || [ ! -f "$EMU/libcudart.so.13" ]; then
	echo "== FAIL no emulator in $BUILD/emu (make emu): the nccl suites cannot run"
	check_add 0 1
	echo "check-nccl: $total_pass passed, $total_fail failed"
	exit 1
fi

# the GPU test program over the emulator: one emulated host per process
# (its emulated device memory lives in a folder of its own, removed when it passed)
gputest() {
	gd=$(mktemp -d /tmp/refit-gpu-emu.XXXXXX) || return 1
	env REFIT_EMU_DEVICES=4 REFIT_EMU_DIR="$gd" \
	    REFIT_EMU_COUNTERS=1 REFIT_CUDA_LIBRARY="$EMU/libcudart.so.13" \
	    REFIT_NCCL_LIBRARY="$EMU/libnccl.so.2" \
	    REFIT_GPU_KERNELS_LIBRARY="$EMU/libcudart.so.13" REFIT_GPU_TEST_EMU=1 "$1"
	rc=$?
	[ $rc -ne 0 ] || rm -rf "$gd"
	return $rc
}

# a kernel library's test program given the emulator as its library
gputest_lib() {
	gd=$(mktemp -d /tmp/refit-gpu-emu.XXXXXX) || return 1
	env REFIT_EMU_DEVICES=1 REFIT_EMU_DIR="$gd" REFIT_EMU_COUNTERS=1 \
	    "$1" "$EMU/libcudart.so.13" && /usr/bin/python3 tests/emu/check_counters.py "$gd"
	rc=$?
	[ $rc -ne 0 ] || rm -rf "$gd"
	return $rc
}

for v in normal asan; do
	if [ $v = normal ]; then b=$BUILD; pairs=$PAIRS; soak=$SOAK; tag=""
	else b=$BUILD/asan; pairs=$ASAN_PAIRS; soak=5; tag=", ASan + UBSan (no LSan)"
		# LeakSanitizer's own tracer crashes now and then (ScanRangeForPointers)
		# when a daemon with the emulator loaded exits: host leaks are checked
		# by the tcp suites under ASan, device leaks by the emulator's counters
		export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1
	fi
	script "GPU test program over the emulator$tag" gputest "$b/tests/gpu-test"
	script "data plane over nccl on the emulator ($pairs layout pairs)$tag" \
		env REFIT_TEST_TRANSPORT=nccl REFIT_EMU_LIB="$EMU" \
		/usr/bin/python3 tests/integration/test_dataplane.py "$b" "$pairs"
	script "faults over nccl on the emulator (${soak} s soak)$tag" \
		env REFIT_TEST_TRANSPORT=nccl REFIT_EMU_LIB="$EMU" \
		/usr/bin/python3 tests/integration/test_faults.py "$b" "$soak"
	script "a poisoned node: health, metric, members, refits refused at once, poisoned_exit$tag" \
		env REFIT_TEST_TRANSPORT=nccl REFIT_EMU_LIB="$EMU" \
		/usr/bin/python3 tests/integration/test_poison.py "$b"
	[ $v = asan ] || script "conversion kernels vs the host quantizer (cvt-gpu-test) on the emulator" \
		gputest_lib "$b/tests/cvt-gpu-test"
	[ $v = asan ] || script "delta kernels vs the host codec (delta-gpu-test) on the emulator" \
		gputest_lib "$b/tests/delta-gpu-test"
	script "conversion over nccl (fp32 -> bf16, bf16 -> fp8 + scales) bit for bit$tag" \
		env REFIT_TEST_TRANSPORT=nccl REFIT_EMU_LIB="$EMU" \
		/usr/bin/python3 tests/integration/test_conversion.py "$b"
	script "tests/gpu/test_gpu_e2e.py (one rank per daemon) on the emulator$tag" \
		env REFIT_TEST_TRANSPORT=nccl REFIT_EMU_LIB="$EMU" \
		/usr/bin/python3 tests/gpu/test_gpu_e2e.py "$b"
done

echo "check-nccl: $total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
