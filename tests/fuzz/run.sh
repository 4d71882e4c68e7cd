#!/bin/sh
# Build the fuzz harnesses with clang's libFuzzer (+ ASan/UBSan) and run
# each for SECONDS seconds from its seed corpus, FUZZ_JOBS (nproc) at once;
# without libFuzzer, replay the corpus through the same harness.  Prints "fuzz: N passed, N failed".
# With RUNS (third argument) each harness instead runs exactly RUNS inputs
# from a fixed seed and an empty work corpus: the same inputs every time,
# which is what `make check` uses so CI cannot turn red by chance; open-ended
# exploration is `make fuzz`.
set -u
BUILD=${1:-build}
SECONDS_EACH=${2:-10}
RUNS=${3:-}
OUT=$BUILD/fuzz
mkdir -p "$OUT"
LIBS="$(pkg-config --libs libcjson 2>/dev/null || echo -lcjson) -lm"
CFLAGS="-std=gnu11 -D_GNU_SOURCE -g -O1 -I. $(pkg-config --cflags libcjson 2>/dev/null)"
SRC="$(ls common/*.c plan/*.c codec/*.c)"
GEN_PB=$BUILD/gen/refit/v1/refit.pb-c.c
JOBS=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 2)}
passed=0
failed=0
have_fuzzer=0
if command -v clang >/dev/null 2>&1 &&
   echo 'int LLVMFuzzerTestOneInput(const char*d,unsigned long s){return 0;}' |
   clang -x c -fsanitize=fuzzer - -o "$OUT/.probe" >/dev/null 2>&1; then
	have_fuzzer=1
fi

# The sources the harnesses share (common/, plan/, codec/, and the rpc and
# delta harnesses' extras) are compiled once, JOBS at a time, with the
# fuzzer's coverage instrumentation and the sanitizers (what
# -fsanitize=fuzzer gives a compiled file); each harness then compiles its
# own file and links those objects.  Compiling every source again for each
# of the six harnesses, one file at a time, was most of the suite's time.
# obj SRC: its object in $OUT/obj
obj() { o=$(echo "$1" | tr / _); echo "$OUT/obj/${o%.c}.o"; }
FZ_CFLAGS="$CFLAGS -I$BUILD/gen -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all"
shared_built=0
torun=""
if [ $have_fuzzer = 1 ]; then
	rm -rf "$OUT/obj" && mkdir -p "$OUT/obj"
	all="$SRC rpc/proto_conv.c dataplane/delta.c"
	[ -f "$GEN_PB" ] && all="$all $GEN_PB"
	for s in $all; do echo "$s $(obj "$s")"; done |
		FZ_CFLAGS=$FZ_CFLAGS xargs -P "$JOBS" -n 2 sh -c 'exec clang $FZ_CFLAGS -c "$1" -o "$2"' sh &&
		shared_built=1
	[ $shared_built = 1 ] || echo "fuzz: the shared sources did not compile (clang's errors above)"
fi
for h in layout topo placement arch rpc delta; do
	extra=""
	extra_src=""
	if [ "$h" = rpc ]; then
		# the RPC edge: generated protobuf-c code and the conversion layer
		[ -f "$GEN_PB" ] ||
			{ echo "fuzz rpc: build first (make)"; failed=$((failed + 1)); continue; }
		extra="-I$BUILD/gen -lprotobuf-c"
		extra_src="$GEN_PB rpc/proto_conv.c"
	fi
	# the delta codec: untrusted encodings from the network
	[ "$h" = delta ] && extra_src="dataplane/delta.c"
	corpus=tests/fuzz/corpus/$h
	work=$OUT/corpus-$h
	mkdir -p "$work"
	if [ $have_fuzzer = 1 ]; then
		objs=""
		for s in $SRC $extra_src; do objs="$objs $(obj "$s")"; done
		if [ $shared_built = 0 ] || ! clang $CFLAGS -fsanitize=fuzzer,address,undefined \
			-fno-sanitize-recover=all -o "$OUT/fuzz-$h" \
			tests/fuzz/fuzz_$h.c $objs $extra $LIBS; then
			echo "fuzz $h: FAILED to build"
			failed=$((failed + 1)); continue
		fi
		torun="$torun $h"
	else
		if ${CC:-gcc} $CFLAGS -fsanitize=address,undefined -o "$OUT/replay-$h" \
			tests/fuzz/replay.c tests/fuzz/fuzz_$h.c $SRC $extra_src $extra $LIBS &&
		   "$OUT/replay-$h" "$corpus"/*; then
			echo "fuzz $h: corpus replayed (no libFuzzer here)"
			passed=$((passed + 1))
		else
			failed=$((failed + 1))
		fi
	fi
done

# the built harnesses run JOBS at a time (each on its own work corpus and
# log), reported in order
if [ -n "$RUNS" ]; then
	limit="-runs=$RUNS -seed=1"
else
	limit="-max_total_time=$SECONDS_EACH"
fi
for h in $torun; do
	rm -f "$OUT/fuzz-$h.rc"
	[ -z "$RUNS" ] || { rm -rf "$OUT/corpus-$h" && mkdir -p "$OUT/corpus-$h"; }
done
[ -z "$torun" ] || printf '%s\n' $torun |
	FZ_OUT=$OUT FZ_LIMIT=$limit xargs -P "$JOBS" -n 1 sh -c '
		"$FZ_OUT/fuzz-$1" $FZ_LIMIT -max_len=4096 -artifact_prefix="$FZ_OUT/" \
			-timeout=10 -rss_limit_mb=2048 -print_final_stats=0 \
			"$FZ_OUT/corpus-$1" "tests/fuzz/corpus/$1" >"$FZ_OUT/fuzz-$1.log" 2>&1
		echo $? >"$FZ_OUT/fuzz-$1.rc"' sh
for h in $torun; do
	if [ "$(cat "$OUT/fuzz-$h.rc" 2>/dev/null)" = 0 ]; then
		if [ -n "$RUNS" ]; then
			echo "fuzz $h: ok ($RUNS inputs, seed 1)"
		else
			echo "fuzz $h: ok ($SECONDS_EACH s)"
		fi
		passed=$((passed + 1))
	else
		echo "fuzz $h: FAILED, see $OUT/fuzz-$h.log"; tail -20 "$OUT/fuzz-$h.log"
		failed=$((failed + 1))
	fi
done
echo "fuzz: $passed passed, $failed failed"
[ $failed = 0 ]
