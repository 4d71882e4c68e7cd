#!/bin/sh
# `make check-nccl`: the nccl transport on the CUDA + NCCL emulator.
#   1. the emulator's own rule tests (tests/run-check-emu.sh);
#   2. the GPU test program (tests/gpu/gpu_test.c) over the emulator: box
#      copies (the strided-copy kernel, size-1 and stride-0 dims), copy
#      errors surfacing at sync, IPC offsets, per-device staging, grouped
#      send/recv between processes and a shrink;
#   3. the data-plane end-to-end suites and the fault suites with
#      REFIT_TEST_TRANSPORT=nccl (node daemons on emulated hosts with 4
#      devices each, clients registering GPU memory by CUDA IPC handle,
#      the emulator's leak counters checked after each suite), and the
#      GPU machine's e2e script (tests/gpu/test_gpu_e2e.py) on the emulator;
#      a poisoned node (tests/integration/test_poison.py: a copy to the host
#      that never ends, REFIT_EMU_HANG_D2H); the conversion kernels' launcher
#      against the host quantizer (cvt-gpu-test) and a converting model over
#      nccl, every byte against the numpy reference (test_conversion.py);
#      the delta kernels against the host codec (delta-gpu-test);
# 2 and 3 once with the normal build and once under ASan + UBSan.
#
# The suites mostly wait (leases, deadlines, the emulator's delays: under
# half a core on average), so they run in lanes at once, each lane its
# suites in order: NCCL_LANES=4 (the default) "rules": 1 with the normal
# build's poison, conversion and e2e suites; "faults": the normal build's
# data plane and faults; "faults-asan": the normal build's GPU test
# program, the ASan build's faults and e2e; "asan": the ASan build's other
# suites (lanes of about equal length).  NCCL_LANES=3: 1, the normal
# build's 2 and 3, the ASan build's; 2: 1 with the normal build's, the
# ASan build's; 1: everything in one process, in order.  Each lane is this script again (--lane NAME
# SUITE...) with its own per-suite logs (BUILD/check-nccl/NAME/) and
# counts; its output is printed whole, lane by lane, once all are done.
# Every suite runs and counts as it did; a lane that ends without its count
# line is one failure.
# Ends with "check-nccl: N passed, N failed".
# Usage: sh tests/run-check-nccl.sh [BUILD_DIR]
#        (NCCL_PAIRS, NCCL_SOAK, NCCL_ASAN_PAIRS, NCCL_LANES)
set -u
BUILD=${1:-build}
LANE=all
N=normal
A=asan
SUITES="rules gpu:$N dataplane:$N faults:$N poison:$N cvt:$N delta:$N conversion:$N e2e:$N
	gpu:$A dataplane:$A faults:$A poison:$A conversion:$A e2e:$A"
if [ "${2:-}" = --lane ]; then
	LANE=${3:-x}
	if [ $# -ge 3 ]; then shift 3; else shift $#; fi
	SUITES=$*
fi
PAIRS=${NCCL_PAIRS:-20}
SOAK=${NCCL_SOAK:-10}
ASAN_PAIRS=${NCCL_ASAN_PAIRS:-6}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$(pwd)/tests/lsan.supp}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
CHECK_DIR=$BUILD/check-nccl
CHECK_LOG=$BUILD/check-nccl.log
if [ "$LANE" != all ]; then
	CHECK_DIR=$BUILD/check-nccl/$LANE
	CHECK_LOG=$BUILD/check-nccl/$LANE.log
fi
mkdir -p "$CHECK_DIR" && rm -f "$CHECK_DIR"/suite-*.log && : >"$CHECK_LOG" || exit 1
. tests/check-lib.sh

# the lanes (NAME:SUITE,SUITE... each) for NCCL_LANES
case ${NCCL_LANES:-4} in
1) LANES="" ;;
2) LANES="normal:rules,gpu:$N,dataplane:$N,faults:$N,poison:$N,cvt:$N,delta:$N,conversion:$N,e2e:$N
	asan:gpu:$A,dataplane:$A,faults:$A,poison:$A,conversion:$A,e2e:$A" ;;
3) LANES="rules:rules
	normal:gpu:$N,dataplane:$N,faults:$N,poison:$N,cvt:$N,delta:$N,conversion:$N,e2e:$N
	asan:gpu:$A,dataplane:$A,faults:$A,poison:$A,conversion:$A,e2e:$A" ;;
*) LANES="rules:rules,poison:$N,cvt:$N,delta:$N,conversion:$N,e2e:$N
	faults:dataplane:$N,faults:$N
	faults-asan:gpu:$N,faults:$A,e2e:$A
	asan:gpu:$A,dataplane:$A,poison:$A,conversion:$A" ;;
esac

if [ "$LANE" = all ] && [ -n "$LANES" ]; then
	k=0
	for spec in $LANES; do
		k=$((k + 1))
		l=${spec%%:*}
		rm -rf "${CHECK_DIR:?}/$l" && mkdir -p "$CHECK_DIR/$l"
		sh "$0" "$BUILD" --lane "$l" $(echo "${spec#*:}" | tr , ' ') \
			>"$CHECK_DIR/$l.out" 2>&1 &
		eval "pid_$k=$!"
	done
	k=0
	for spec in $LANES; do
		k=$((k + 1))
		l=${spec%%:*}
		eval "wait \$pid_$k"
		rc=$?
		echo "== lane $l (exit status $rc)"
		cat "$CHECK_DIR/$l.out"
		cat "$CHECK_DIR/$l.log" >>"$CHECK_LOG" 2>/dev/null
		line=$(grep -E "^check-nccl lane [a-z-]+: [0-9]+ passed, [0-9]+ failed$" \
			"$CHECK_DIR/$l.out" | tail -1)
		if [ -z "$line" ]; then
			echo "FAIL lane $l ended without its count line (status $rc)"
			check_add 0 1
			continue
		fi
		p=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed.*/\1/')
		f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed$/\1/')
		check_add "$p" "$f"
		[ "$rc" -eq 0 ] || [ "$f" -gt 0 ] ||
			{ echo "FAIL lane $l: exit status $rc with no failure counted"; check_add 0 1; }
	done
	echo "check-nccl: $total_pass passed, $total_fail failed"
	[ "$total_fail" -eq 0 ]
	exit
fi

# the end of a lane, or of the whole run
finish() {
	if [ "$LANE" = all ]; then
		echo "check-nccl: $total_pass passed, $total_fail failed"
	else
		echo "check-nccl lane $LANE: $total_pass passed, $total_fail failed"
	fi
	[ "$total_fail" -eq 0 ]
	exit
}

EMU=$(cd "$BUILD/emu" 2>/dev/null && pwd) || EMU=""
# the suites after the rule tests need the emulator
emu_present() {
	[ -n "$EMU" ] && [ -f "$EMU/libcudart.so.13" ] && return 0
	echo "== FAIL no emulator in $BUILD/emu (make emu): the nccl suites cannot run"
	check_add 0 1
	finish
}

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

# suite NAME VARIANT: one suite with the normal build (normal) or under
# ASan + UBSan (asan)
suite() {
	case $2 in normal | asan) ;;
	*) echo "FAIL unknown suite \"$1:$2\""; check_add 0 1; return ;;
	esac
	if [ "$2" = normal ]; then b=$BUILD; pairs=$PAIRS; soak=$SOAK; tag=""
	else b=$BUILD/asan; pairs=$ASAN_PAIRS; soak=5; tag=", ASan + UBSan (no LSan)"
		# LeakSanitizer's own tracer crashes now and then (ScanRangeForPointers)
		# when a daemon with the emulator loaded exits: host leaks are checked
		# by the tcp suites under ASan, device leaks by the emulator's counters
		export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1
	fi
	case $1 in
	gpu) script "GPU test program over the emulator$tag" gputest "$b/tests/gpu-test" ;;
	dataplane) script "data plane over nccl on the emulator ($pairs layout pairs)$tag" \
		env REFIT_TEST_TRANSPORT=nccl REFIT_EMU_LIB="$EMU" \
		/usr/bin/python3 tests/integration/test_dataplane.py "$b" "$pairs"
		script "data plane limits over nccl on the emulator$tag" \
		env REFIT_TEST_TRANSPORT=nccl REFIT_EMU_LIB="$EMU" \
		/usr/bin/python3 tests/integration/test_dataplane_limits.py "$b" ;;
	faults) script "faults over nccl on the emulator (${soak} s soak)$tag" \
		env REFIT_TEST_TRANSPORT=nccl REFIT_EMU_LIB="$EMU" \
		/usr/bin/python3 tests/integration/test_faults.py "$b" "$soak"
		script "faults around single calls over nccl on the emulator$tag" \
		env REFIT_TEST_TRANSPORT=nccl REFIT_EMU_LIB="$EMU" \
		/usr/bin/python3 tests/integration/test_faults_calls.py "$b"
		script "faults: partitions over nccl on the emulator$tag" \
		env REFIT_TEST_TRANSPORT=nccl REFIT_EMU_LIB="$EMU" \
		/usr/bin/python3 tests/integration/test_faults_partition.py "$b" ;;
	poison) script "a poisoned node: health, metric, members, refits refused at once, poisoned_exit$tag" \
		env REFIT_TEST_TRANSPORT=nccl REFIT_EMU_LIB="$EMU" \
		/usr/bin/python3 tests/integration/test_poison.py "$b" ;;
	cvt) script "conversion kernels vs the host quantizer (cvt-gpu-test) on the emulator$tag" \
		gputest_lib "$b/tests/cvt-gpu-test" ;;
	delta) script "delta kernels vs the host codec (delta-gpu-test) on the emulator$tag" \
		gputest_lib "$b/tests/delta-gpu-test" ;;
	conversion) script "conversion over nccl (fp32 -> bf16, bf16 -> fp8 + scales) bit for bit$tag" \
		env REFIT_TEST_TRANSPORT=nccl REFIT_EMU_LIB="$EMU" \
		/usr/bin/python3 tests/integration/test_conversion.py "$b" ;;
	e2e) script "tests/gpu/test_gpu_e2e.py (one rank per daemon) on the emulator$tag" \
		env REFIT_TEST_TRANSPORT=nccl REFIT_EMU_LIB="$EMU" \
		/usr/bin/python3 tests/gpu/test_gpu_e2e.py "$b" ;;
	*) echo "FAIL unknown suite \"$1:$2\""; check_add 0 1 ;;
	esac
}

for s in $SUITES; do
	if [ "$s" = rules ]; then
		script "emulator rule tests (tests/run-check-emu.sh)" sh tests/run-check-emu.sh "$BUILD"
	else
		emu_present
		suite "${s%%:*}" "${s#*:}"
	fi
done
finish
