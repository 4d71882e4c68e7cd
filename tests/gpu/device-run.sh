#!/bin/sh
# The GPU checks on a bare, offline one-GPU machine (issue 24 item 4), in
# two short calls over a build/ made elsewhere (nvcc and the NCCL headers
# are on the build machine; nothing is built or fetched on the device).
#
#   sh tests/gpu/device-run.sh prepare [BUILD]   on the build machine, after
#        make all: copies the shared libraries refitd, refit-client and
#        gpu-test need beyond glibc into BUILD/device-libs (the device image
#        lacks gRPC, absl, protobuf-c, libuv, cJSON, libmicrohttpd), the
#        Python stubs of proto/refit/v1 into BUILD/device-stubs (the device
#        has grpcio and protobuf, not grpc_tools), and prints what to carry
#        (under the 64 MiB a call may carry) and the two commands.
#   sh tests/gpu/device-run.sh gpu [BUILD]       call 1 (< 5 min): gpu-test,
#        then cvt-gpu-test (the conversion kernels against the host, bit for bit).
#   sh tests/gpu/device-run.sh e2e [BUILD]       call 2 (< 5 min):
#        tests/gpu/test_gpu_e2e.py, three refitd node daemons sharing the GPU
#        over NCCL's socket transport, refit-client with CUDA IPC memory.
#
# The CUDA runtime and NCCL are the device's own (its python3's
# nvidia-cuda-runtime and nvidia-nccl-cu13 wheels, else /usr/local/cuda):
# libnccl.so.2 is 200+ MiB, more than a call may carry.  Each call prints
# "device: N passed, N failed" last and writes its logs and figures
# (figures.json: counts, the loopback GB/s, the library paths) under $OUT
# (or BUILD/device-out).  Exit 0 only when nothing failed.
set -u
PHASE=${1:-}
BUILD=${2:-build}
OUTD=${OUT:-$BUILD/device-out}
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
finish() {
	printf '{"phase": "%s", "passed": %d, "failed": %d%s}\n' "$PHASE" "$pass" "$fail" \
		"${FIG:-}" >"$OUTD/figures-$PHASE.json"
	echo "device: $pass passed, $fail failed"
	[ "$fail" -eq 0 ]
	exit $?
}

prepare() {
	libs=$BUILD/device-libs
	rm -rf "$libs" "$BUILD/device-stubs" && mkdir -p "$libs" "$BUILD/device-stubs" || exit 1
	# the closure of the binaries' libraries, less glibc's, libstdc++,
	# libgcc_s and libcudart (the device's own, matching its driver)
	for f in "$BUILD/bin/refitd" "$BUILD/bin/refit-client" "$BUILD/tests/gpu-test" \
		 "$BUILD/tests/cvt-gpu-test"; do
		ldd "$f" | awk '$3 ~ /^\// {print $3}'
	done | sort -u | grep -Ev '/(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+|libcudart)\.so' |
		while read -r l; do cp -L "$l" "$libs/"; done
	/usr/bin/python3 -m grpc_tools.protoc -Iproto --python_out="$BUILD/device-stubs" \
		--grpc_python_out="$BUILD/device-stubs" proto/refit/v1/refit.proto || exit 1
	for d in bin lib tests device-libs device-stubs; do du -sm "$BUILD/$d"; done
	echo "carry: [\"$BUILD/bin\", \"$BUILD/lib\", \"$BUILD/tests\", \"$BUILD/device-libs\", \"$BUILD/device-stubs\"] (keep the sum under 64 MiB with the tree)"
	echo "call 1: sh tests/gpu/device-run.sh gpu $BUILD    (timeout_s 290)"
	echo "call 2: sh tests/gpu/device-run.sh e2e $BUILD    (timeout_s 290)"
	exit 0
}

[ "$PHASE" = prepare ] && prepare
case $PHASE in gpu|e2e) ;; *) echo "usage: device-run.sh prepare|gpu|e2e [BUILD]"; exit 2 ;; esac
mkdir -p "$OUTD" || exit 1
if ! nvidia-smi -L >"$OUTD/nvidia-smi.txt" 2>&1; then
	bad "nvidia-smi: no GPU or no driver ($(head -1 "$OUTD/nvidia-smi.txt"))"
	finish
fi
cat "$OUTD/nvidia-smi.txt"
[ -d "$BUILD/device-libs" ] || { bad "no $BUILD/device-libs: run 'prepare' and carry it"; finish; }
# the device's CUDA runtime and NCCL: its python3's wheels, else the toolkit
py_lib() {
	/usr/bin/env python3 -c "import importlib, os, sys
m = importlib.import_module('$1'); p = list(getattr(m, '__path__', []))
print(os.path.join(p[0], 'lib') if p else '')" 2>/dev/null
}
CUDART_DIR=$(py_lib nvidia.cuda_runtime)
NCCL_DIR=$(py_lib nvidia.nccl)
[ -f "$CUDART_DIR/libcudart.so.13" ] || CUDART_DIR=/usr/local/cuda/lib64
[ -f "$NCCL_DIR/libnccl.so.2" ] || NCCL_DIR=/usr/local/cuda/lib64
for f in "$CUDART_DIR/libcudart.so.13" "$NCCL_DIR/libnccl.so.2"; do
	[ -f "$f" ] || { bad "no $f on this machine"; finish; }
done
export LD_LIBRARY_PATH="$(pwd)/$BUILD/device-libs:$CUDART_DIR:$NCCL_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export REFIT_CUDA_LIBRARY="$CUDART_DIR/libcudart.so.13"
export REFIT_NCCL_LIBRARY="$NCCL_DIR/libnccl.so.2"
export REFIT_GPU_KERNELS_LIBRARY="$(pwd)/$BUILD/lib/librefit-gpu-kernels.so"
FIG=", \"cudart\": \"$REFIT_CUDA_LIBRARY\", \"nccl\": \"$REFIT_NCCL_LIBRARY\""

if [ "$PHASE" = gpu ]; then
	timeout 200 "$BUILD/tests/gpu-test" >"$OUTD/gpu-test.log" 2>&1
	rc=$?
	grep -E "^(ok|FAIL|gpu:)|GB/s" "$OUTD/gpu-test.log"
	[ $rc -eq 0 ] && ok "gpu-test" || bad "gpu-test exited $rc (77: skipped; $OUTD/gpu-test.log)"
	gbs=$(grep -oE "[0-9.]+ GB/s" "$OUTD/gpu-test.log" | head -1 | cut -d' ' -f1)
	FIG="$FIG, \"loopback_gbs\": \"${gbs:-}\""
	timeout 60 "$BUILD/tests/cvt-gpu-test" "$BUILD/lib/librefit-convert-cuda.so" \
		>"$OUTD/cvt-gpu-test.log" 2>&1
	rc=$?
	tail -2 "$OUTD/cvt-gpu-test.log"
	if [ $rc -eq 0 ] && grep -qE "^cvt-gpu: [1-9][0-9]* passed, 0 failed" "$OUTD/cvt-gpu-test.log"; then
		ok "cvt-gpu-test: the conversion kernels equal the host bit for bit"
	else
		bad "cvt-gpu-test exited $rc ($OUTD/cvt-gpu-test.log)"
	fi
	finish
fi

# e2e: the node daemons and clients on this GPU, the stubs made on the build machine
REFIT_PROTO_STUBS="$(pwd)/$BUILD/device-stubs" REFIT_TEST_TRANSPORT=nccl REFIT_TEST_GPU=1 \
	PYTHONUNBUFFERED=1 timeout 270 python3 tests/gpu/test_gpu_e2e.py "$BUILD" \
	>"$OUTD/gpu-e2e.log" 2>&1
rc=$?
grep -E "^(ok|FAIL)|gpu-e2e:" "$OUTD/gpu-e2e.log"
line=$(grep -E "^gpu-e2e: [0-9]+ passed, [0-9]+ failed" "$OUTD/gpu-e2e.log" | tail -1)
FIG="$FIG, \"e2e\": \"${line:-none}\""
[ $rc -eq 0 ] && [ -n "$line" ] && ok "GPU e2e ($line)" || bad "GPU e2e exited $rc ($OUTD/gpu-e2e.log)"
finish
