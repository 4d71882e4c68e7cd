#!/bin/sh
# What `make check` runs once everything is built: unit tests and CLI tests
# with the normal build, the same under ASan + UBSan, then the fuzz
# harnesses briefly.  Ends with one summary line "check: N passed, N failed".
set -u
BUILD=${1:-build}
FUZZ_RUNS=${FUZZ_RUNS:-20000}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$(pwd)/tests/lsan.supp}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export CK_DEFAULT_TIMEOUT=${CK_DEFAULT_TIMEOUT:-120}
total_pass=0
total_fail=0
log=$BUILD/check.log
: >"$log"

add() { total_pass=$((total_pass + $1)); total_fail=$((total_fail + $2)); }

# run a Check binary; count from its "Checks: N, Failures: F, Errors: E" line
unit() {
	echo "== $1"
	"$2" 2>&1 | tee -a "$log" | grep -E "^[0-9]+%: Checks|:[EF]:" || true
	line=$(grep -E "^[0-9]+%: Checks" "$log" | tail -1)
	n=$(echo "$line" | sed -E 's/.*Checks: ([0-9]+).*/\1/')
	f=$(echo "$line" | sed -E 's/.*Failures: ([0-9]+).*/\1/')
	e=$(echo "$line" | sed -E 's/.*Errors: ([0-9]+).*/\1/')
	if [ -z "$line" ]; then add 0 1; return; fi
	add $((n - f - e)) $((f + e))
}

# run a script that ends with "...: N passed, N failed"
script() {
	echo "== $1"
	shift
	out=$("$@" 2>&1)
	echo "$out" | tee -a "$log" | grep -E "FAIL|passed, [0-9]+ failed" || true
	line=$(echo "$out" | grep -E "[0-9]+ passed, [0-9]+ failed" | tail -1)
	if [ -z "$line" ]; then add 0 1; return; fi
	p=$(echo "$line" | sed -E 's/.* ([0-9]+) passed.*/\1/; s/^([0-9]+) passed.*/\1/')
	f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
	add "$p" "$f"
}

unit "unit tests" "$BUILD/tests/unit"
script "CLI tests" sh tests/cli/run.sh "$BUILD/bin/refit-plan"
unit "unit tests, ASan + UBSan" "$BUILD/asan/tests/unit"
script "CLI tests, ASan + UBSan" sh tests/cli/run.sh "$BUILD/asan/bin/refit-plan"
script "control plane (coordinator + Python gRPC + refitctl)" \
	/usr/bin/python3 tests/integration/test_control_plane.py "$BUILD"
script "control plane, ASan + UBSan" \
	/usr/bin/python3 tests/integration/test_control_plane.py "$BUILD/asan"
script "data plane (coordinator + 6 nodes + librefit clients, 50 layout pairs)" \
	/usr/bin/python3 tests/integration/test_dataplane.py "$BUILD" 50
script "data plane, ASan + UBSan (8 layout pairs)" \
	/usr/bin/python3 tests/integration/test_dataplane.py "$BUILD/asan" 8
script "faults (SIGKILL, SIGSTOP, cut links, retry, catch-up, restarts, drain, 30 s soak)" \
	/usr/bin/python3 tests/integration/test_faults.py "$BUILD" 30
script "faults, ASan + UBSan (5 s soak)" \
	/usr/bin/python3 tests/integration/test_faults.py "$BUILD/asan" 5
script "fuzz ($FUZZ_RUNS inputs per harness, fixed seed)" \
	sh tests/fuzz/run.sh "$BUILD" 0 "$FUZZ_RUNS"

script "conversion: C vs the numpy reference" /usr/bin/python3 tests/conversion/test_ref.py "$BUILD"
script "conversion kernels on the GPU vs the host (skipped without one)" "$BUILD/tests/cvt-gpu-test" "$BUILD/lib/librefit-convert-cuda.so"
script "conversion end to end (fp32 -> bf16/fp16, bf16/fp16 -> fp8 with block and tensor scales, vs numpy)" /usr/bin/python3 tests/integration/test_conversion.py "$BUILD"
script "conversion end to end, ASan + UBSan" /usr/bin/python3 tests/integration/test_conversion.py "$BUILD/asan"

echo "== GPU tests (tests/gpu/run.sh: they run where a GPU is, else say why not)"
sh tests/gpu/run.sh "$BUILD" | tee -a "$log" | tail -3

echo "check: $total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
