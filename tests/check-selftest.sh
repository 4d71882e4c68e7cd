#!/bin/sh
# check-selftest.sh - tests/check-lib.sh counts what a suite did, not what
# an earlier one printed: fake suites that crash, lie with their exit status
# or print no result line must each count as a failure.  Ends with
# "selftest: N passed, N failed".
set -u
T=$(mktemp -d /tmp/refit-selftest.XXXXXX) || exit 1
trap 'rm -rf "$T"' EXIT
passed=0
failed=0

# expect NAME PASS FAIL SKIP -- KIND CMD...: a fresh count of one suite
expect() {
	name=$1 wp=$2 wf=$3 ws=$4
	shift 5
	(
		CHECK_DIR=$T
		CHECK_LOG=$T/all.log
		. tests/check-lib.sh
		# an earlier suite's good result sits in the shared log
		echo "100%: Checks: 7, Failures: 0, Errors: 0" >>"$CHECK_LOG"
		echo "7 passed, 0 failed" >>"$CHECK_LOG"
		"$@" >"$T/out" 2>&1
		[ "$total_pass $total_fail $total_skip" = "$wp $wf $ws" ] || {
			echo "got $total_pass passed, $total_fail failed, $total_skip skipped"
			exit 1
		}
	)
	if [ $? -eq 0 ]; then
		passed=$((passed + 1)); echo "ok   $name"
	else
		failed=$((failed + 1)); echo "FAIL $name: wanted $wp passed, $wf failed, $ws skipped"
		cat "$T/out"
	fi
}

# NAME|PASS|FAIL|SKIP|KIND|the fake suite's shell command
while IFS='|' read -r name wp wf ws kind cmd; do
	expect "$name" "$wp" "$wf" "$ws" -- "$kind" t sh -c "$cmd" </dev/null
done <<'EOF'
unit: good result|3|1|0|unit|echo "100%: Checks: 4, Failures: 1, Errors: 0"; exit 1
unit: crash before the result line|0|1|0|unit|echo starting; kill -SEGV $$
unit: result line then a crash|4|1|0|unit|echo "100%: Checks: 4, Failures: 0, Errors: 0"; kill -ABRT $$
script: good result|5|0|0|script|echo "x: 5 passed, 0 failed"
script: counts its own failures|5|2|0|script|echo "x: 5 passed, 2 failed"; exit 1
script: no result line|0|1|0|script|echo "Traceback"; exit 1
script: all passed but exit status 1|5|1|0|script|echo "x: 5 passed, 0 failed"; exit 1
script: the last result line counts|2|1|0|script|echo "a: 9 passed, 0 failed"; echo "b: 2 passed, 1 failed"; exit 1
gpu: no GPU is a skip|0|0|1|gpu|echo "gpu: skipped: no NVIDIA GPU on this machine (no nvidia-smi)"
gpu: a skip where a GPU is fails|0|1|0|gpu|echo "gpu: skipped: libnccl.so.2 not found"
gpu: passed|1|0|0|gpu|echo "gpu: passed (0 failures)"
gpu: failed|0|1|0|gpu|echo "gpu: FAILED (2 failures)"; exit 1
gpu: crash|0|1|0|gpu|echo "ok   pack"; kill -SEGV $$
EOF

echo "selftest: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
