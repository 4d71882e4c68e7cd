#!/bin/sh
# The CUDA + NCCL emulator's own checks (tests/emu/README.md): its ABI
# against the real headers where they exist, then the rule tests.
# Usage: tests/run-check-emu.sh [BUILD] [test-name-substring]
# Ends with one line "emu: N passed, N failed".
set -u
BUILD=${1:-build}
E=$BUILD/emu
pass=0
fail=0

if [ ! -x "$E/test-emu" ]; then
	echo "FAIL $E/test-emu is missing (make emu)"
	echo "emu: 0 passed, 1 failed"
	exit 1
fi
if [ -x "$E/abi-dump-real" ]; then
	"$E/abi-dump" >"$E/abi-own.txt" && "$E/abi-dump-real" >"$E/abi-real.txt"
	if diff "$E/abi-own.txt" "$E/abi-real.txt"; then
		echo "ok   abi (tests/emu/cuda_abi.h matches the CUDA and NCCL headers)"
		pass=$((pass + 1))
	else
		echo "FAIL abi: tests/emu/cuda_abi.h differs from the real headers (diff above)"
		fail=$((fail + 1))
	fi
else
	echo "skip abi: no CUDA and NCCL headers here"
fi
# the leak checker over counter dumps: a clean and a leaking process
cc_dir=$(mktemp -d /tmp/refit-emu-cc-XXXXXX)
mkdir -p "$cc_dir/counters"
echo '{"pid":1,"host":"a","devices":2,"alloc_live":[0,0],"alloc_bytes_live":[0,0],"ipc_open":0,"streams_live":0,"comms_live":0,"ids_unconsumed":0,"pair_bytes":{"0->1":5},"sticky":""}' >"$cc_dir/counters/1.json"
cc=/usr/bin/python3
"$cc" tests/emu/check_counters.py "$cc_dir" >/dev/null; r1=$?
echo '{"pid":2,"host":"a","devices":2,"alloc_live":[0,1],"alloc_bytes_live":[0,8],"ipc_open":0,"streams_live":0,"comms_live":0,"ids_unconsumed":1,"pair_bytes":{},"sticky":""}' >"$cc_dir/counters/2.json"
"$cc" tests/emu/check_counters.py "$cc_dir" >/dev/null; r2=$?
"$cc" tests/emu/check_counters.py "$cc_dir" --allow alloc --allow ids >/dev/null; r3=$?
rm -rf "$cc_dir"
if [ "$r1$r2$r3" = "010" ]; then
	echo "ok   check_counters.py: clean 0, leaking 1, allowed 0"
	pass=$((pass + 1))
else
	echo "FAIL check_counters.py: exit codes $r1 $r2 $r3, want 0 1 0"
	fail=$((fail + 1))
fi

# run one build of the rule tests; add its counts
rules() {
	out=$("$@" 2>&1)
	echo "$out" | grep -v '^emu: '
	line=$(echo "$out" | grep -E '^emu: [0-9]+ passed, [0-9]+ failed$' | tail -1)
	if [ -z "$line" ]; then
		echo "FAIL $1 ended without its summary line"
		fail=$((fail + 1))
		return
	fi
	pass=$((pass + $(echo "$line" | sed -E 's/^emu: ([0-9]+) passed.*/\1/')))
	fail=$((fail + $(echo "$line" | sed -E 's/.* ([0-9]+) failed$/\1/')))
}

rules "$E/test-emu" ${2:-}
if [ -x "$E/asan/test-emu" ]; then
	echo "== the same under ASan + UBSan"
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1 \
		rules "$E/asan/test-emu" ${2:-}
fi
echo "emu: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
