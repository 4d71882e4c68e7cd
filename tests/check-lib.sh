# check-lib.sh - how tests/run-check.sh counts a suite.  Sourced, not run.
#
# Each suite is counted by its own exit status and its own result line, read
# from its own output (never from a log shared with other suites):
#   unit  TITLE CMD...   a Check binary: "N%: Checks: N, Failures: F, Errors: E"
#   script TITLE CMD...  anything ending with "...N passed, N failed"; one
#                        that ran nothing and printed "NAME: SKIP: why"
#                        counts as skipped (an engine build PyPI lacks)
#   gpu   TITLE CMD...   tests/gpu/run.sh: "gpu: passed" / "gpu: FAILED"; a skip
#                        counts as nothing only where the machine has no GPU
# A missing result line, or a non-zero exit status with no failure counted,
# is one failure: a crash can never pass.  Callers set CHECK_DIR (a folder
# for the per-suite logs) and read total_pass / total_fail / total_skip.
total_pass=0
total_fail=0
total_skip=0
check_n=0

check_add() { total_pass=$((total_pass + $1)); total_fail=$((total_fail + $2)); }

# check_run TITLE CMD...: runs CMD, its output in $check_out, status in $check_rc
check_run() {
	check_n=$((check_n + 1))
	echo "== $1"
	shift
	check_out=$CHECK_DIR/suite-$check_n.log
	check_t0=$(date +%s)
	"$@" >"$check_out" 2>&1
	check_rc=$?
	# each suite's wall time, so a slow one can be found (a figure, not a test)
	echo "   ($(( $(date +%s) - check_t0 )) s)"
	[ -n "${CHECK_LOG:-}" ] && cat "$check_out" >>"$CHECK_LOG"
}

# check_fail WHY: one failure, with the end of the suite's output
check_fail() {
	echo "FAIL $1; see $check_out"
	tail -20 "$check_out"
	check_add 0 1
}

# the failure when the status says so but the counts do not
check_status() { # failures-counted
	if [ "$check_rc" -ne 0 ] && [ "$1" -eq 0 ]; then
		check_fail "exit status $check_rc with no failure counted (a crash?)"
	fi
}

# check_line SHOW RESULT WHAT: prints the output's lines matching SHOW and
# sets $line to the last line matching RESULT; without one, one failure
# naming the WHAT line, and status 1
check_line() {
	grep -E "$1" "$check_out"
	line=$(grep -E "$2" "$check_out" | tail -1)
	[ -n "$line" ] && return 0
	check_fail "no $3 line (status $check_rc)"
	return 1
}

unit() {
	check_run "$@"
	check_line "^[0-9]+%: Checks|:[EF]:" \
		"^[0-9]+%: Checks: [0-9]+, Failures: [0-9]+, Errors: [0-9]+" "Check result" || return 0
	n=$(echo "$line" | sed -E 's/.*Checks: ([0-9]+).*/\1/')
	f=$(echo "$line" | sed -E 's/.*Failures: ([0-9]+).*/\1/')
	e=$(echo "$line" | sed -E 's/.*Errors: ([0-9]+).*/\1/')
	check_add $((n - f - e)) $((f + e))
	check_status $((f + e))
}

script() {
	check_run "$@"
	check_line "FAIL|passed, [0-9]+ failed" "(^|[^0-9])[0-9]+ passed, [0-9]+ failed" \
		'"N passed, N failed"' || return 0
	p=$(echo "$line" | sed -E 's/^(.*[^0-9])?([0-9]+) passed, ([0-9]+) failed.*/\2/')
	f=$(echo "$line" | sed -E 's/^(.*[^0-9])?([0-9]+) passed, ([0-9]+) failed.*/\3/')
	check_add "$p" "$f"
	# a suite that ran nothing and says SKIP (an engine build PyPI lacks)
	if [ "$p" -eq 0 ] && [ "$f" -eq 0 ] && grep ": SKIP: " "$check_out"; then
		total_skip=$((total_skip + 1))
	fi
	check_status "$f"
}

gpu() {
	check_run "$@"
	tail -3 "$check_out"
	if [ "$check_rc" -eq 0 ] && grep -q "^gpu: skipped: no NVIDIA GPU" "$check_out"; then
		total_skip=$((total_skip + 1))
	elif grep -q "^gpu: skipped" "$check_out"; then
		echo "FAIL a GPU is here but the GPU suite skipped"
		check_add 0 1
	elif [ "$check_rc" -eq 0 ] && grep -q "^gpu: passed" "$check_out"; then
		check_add 1 0
	else
		check_fail "GPU suite: status $check_rc"
	fi
}
