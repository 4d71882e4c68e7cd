#!/bin/sh
# What `make check` runs once everything is built: unit tests and CLI tests
# with the normal build, the same under ASan + UBSan, the integration
# suites, the fuzz harnesses briefly, the GPU suite.  Ends with one summary
# line "check: N passed, N failed".  How each suite is counted:
# tests/check-lib.sh (its own status and result line; a crash is a failure).
# To add a suite, append one line below: unit|script|gpu "title" command...
set -u
BUILD=${1:-build}
FUZZ_RUNS=${FUZZ_RUNS:-20000}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$(pwd)/tests/lsan.supp}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export CK_DEFAULT_TIMEOUT=${CK_DEFAULT_TIMEOUT:-120}
CHECK_DIR=$BUILD/check
CHECK_LOG=$BUILD/check.log
mkdir -p "$CHECK_DIR" && rm -f "$CHECK_DIR"/suite-*.log && : >"$CHECK_LOG" || exit 1
. tests/check-lib.sh
check_start=$(date +%s)
# The Python stubs of proto/refit/v1 made once for every suite that asks
# tests/integration/protostubs.py (REFIT_PROTO_STUBS; about 0.6 s a suite);
# when protoc fails here each suite makes its own, as before.
if [ -z "${REFIT_PROTO_STUBS:-}" ] && rm -rf "$BUILD/check-stubs" &&
	mkdir -p "$BUILD/check-stubs" && /usr/bin/python3 -m grpc_tools.protoc -Iproto \
	--python_out="$BUILD/check-stubs" --grpc_python_out="$BUILD/check-stubs" \
	proto/refit/v1/refit.proto; then
	REFIT_PROTO_STUBS=$(cd "$BUILD/check-stubs" && pwd) && export REFIT_PROTO_STUBS
fi

script "the check runner counts crashes and missing result lines" sh tests/check-selftest.sh
script "layers: no file-level call cycles in plan, daemon/coord, daemon/node, rpc, daemon/transport" \
	/usr/bin/python3 tests/check-layers.py "$BUILD"
script "figures: scripts/figures.py rewrites only its regions, fails and skips cleanly" \
	/usr/bin/python3 tests/check-figures.py
unit "unit tests" "$BUILD/tests/unit"
script "CLI tests" sh tests/cli/run.sh "$BUILD/bin/refit-plan"
unit "unit tests, ASan + UBSan" "$BUILD/asan/tests/unit"
script "CLI tests, ASan + UBSan" sh tests/cli/run.sh "$BUILD/asan/bin/refit-plan"
# The second lane: suites that start no daemon and take no fixed port (the
# framework maps against the frameworks' own code, the numpy reference) run
# beside the others, mostly waiting on leases and processes, and are counted
# when both lanes are done (their output is printed then, in order).
framework_suites() {
	script "conversion: C vs the numpy reference" /usr/bin/python3 tests/conversion/test_ref.py "$BUILD"
	# the maps against the frameworks' own code, each in its environment from
	# python/frameworks.txt (make deps: scripts/pydeps.sh)
	script "frameworks: vLLM's own load_weights on CPU (tp 1-8, ep) against refit's maps" \
		"$BUILD/venv-vllm/bin/python" tests/frameworks/test_vllm.py "$BUILD"
	script "frameworks: SGLang's own loader on CPU (tp 1-8, dp, ep) against refit's maps" \
		"$BUILD/venv-sglang/bin/python" tests/frameworks/test_sglang.py "$BUILD"
	script "frameworks: megatron-bridge's HF -> Megatron-Core load (tp, pp, ep, etp) against refit's maps" \
		"$BUILD/venv-megatron/bin/python" tests/frameworks/test_megatron.py "$BUILD"
	script "frameworks: FSDP2 + TP DTensors on 4 gloo processes against refit's boxes (C and Python)" \
		"$BUILD/venv-vllm/bin/python" tests/frameworks/test_fsdp2.py "$BUILD"
	script "frameworks: maps discovered from vLLM's own loader equal refit's, and pass the C checks" \
		"$BUILD/venv-vllm/bin/python" tests/frameworks/test_discover.py "$BUILD"
	script "frameworks: maps discovered from SGLang's own loader equal refit's, and pass the C checks" \
		"$BUILD/venv-sglang/bin/python" tests/frameworks/test_discover.py "$BUILD"
	script "refit.vllm refuses by name the engines it cannot serve exactly (CUDA workers, quantization, PP/DP, a parameter either side lacks, a shape); its switch decided together over two fake nodes, AsyncEngine's pauses" \
		"$BUILD/venv-vllmcpu/bin/python" tests/frameworks/test_vllm_refusals.py "$BUILD"
}
LANE2=$CHECK_DIR/lane2
rm -rf "$LANE2" && mkdir -p "$LANE2" || exit 1
(
	CHECK_DIR=$LANE2 CHECK_LOG=$LANE2/check.log
	total_pass=0 total_fail=0 total_skip=0 check_n=0
	: >"$CHECK_LOG"
	framework_suites
	echo "$total_pass $total_fail $total_skip" >"$LANE2/totals"
) >"$LANE2/out" 2>&1 &
lane2_pid=$!

script "control plane (coordinator + Python gRPC + refitctl)" \
	/usr/bin/python3 tests/integration/test_control_plane.py "$BUILD"
script "control plane, ASan + UBSan" \
	/usr/bin/python3 tests/integration/test_control_plane.py "$BUILD/asan"
script "control plane: the state file and configuration (durable or refused, strict loader, old files, restarts, config files, socket lock)" \
	/usr/bin/python3 tests/integration/test_control_plane_state.py "$BUILD"
script "control plane: the state file and configuration, ASan + UBSan" \
	/usr/bin/python3 tests/integration/test_control_plane_state.py "$BUILD/asan"
script "who may call what (a join token; rogues without it and acting for another node refused, nothing changed; SIGHUP rotation; secure by default)" \
	/usr/bin/python3 tests/integration/test_auth.py "$BUILD"
script "who may call what, ASan + UBSan" \
	/usr/bin/python3 tests/integration/test_auth.py "$BUILD/asan"
script "mutual TLS (refitctl init's CA and certificates; a refit byte-exact; rogues with no, another node's, another CA's, an expired certificate refused, nothing changed; SIGHUP rotation)" \
	/usr/bin/python3 tests/integration/test_tls.py "$BUILD"
script "mutual TLS, ASan + UBSan" \
	/usr/bin/python3 tests/integration/test_tls.py "$BUILD/asan"
script "data plane (coordinator + 6 nodes + librefit clients, 50 layout pairs, every refit again as delta)" \
	/usr/bin/python3 tests/integration/test_dataplane.py "$BUILD" 50
script "data plane, ASan + UBSan (8 layout pairs, every refit again as delta)" \
	/usr/bin/python3 tests/integration/test_dataplane.py "$BUILD/asan" 8
script "data plane limits (aborts, a client killed, dial and epoch deadlines, instance lease, unhealthy instances, delta room, relay staging)" \
	/usr/bin/python3 tests/integration/test_dataplane_limits.py "$BUILD"
script "data plane limits, ASan + UBSan" \
	/usr/bin/python3 tests/integration/test_dataplane_limits.py "$BUILD/asan"
script "faults (SIGKILL, SIGSTOP, cut links, retry, catch-up, restarts, drain, a node leaving, 30 s soak, a peer without grpc-status)" \
	/usr/bin/python3 tests/integration/test_faults.py "$BUILD" 30
script "faults, ASan + UBSan (5 s soak)" \
	/usr/bin/python3 tests/integration/test_faults.py "$BUILD/asan" 5
script "faults around single calls (no state file, atomic switch, a lost Publish, Abort before RunSlice, PrepareEpoch once, aborts and watched channels under long leases)" \
	/usr/bin/python3 tests/integration/test_faults_calls.py "$BUILD"
script "faults around single calls, ASan + UBSan" \
	/usr/bin/python3 tests/integration/test_faults_calls.py "$BUILD/asan"
script "faults: partitions (either node of an instance cut mid-refit, in either order, across a coordinator restart; caught up)" \
	/usr/bin/python3 tests/integration/test_faults_partition.py "$BUILD"
script "faults: partitions, ASan + UBSan" \
	/usr/bin/python3 tests/integration/test_faults_partition.py "$BUILD/asan"
script "coordinators over a 3-member etcd (standbys, leader SIGKILLed and SIGSTOPped, a 30-refit soak killing the leader between Commit and Publish, in-refit, at random and idle, etcd members lost and restarted, etcd stopped, the election watched, a state over etcd's request limit in chunks; ~190 s)" \
	/usr/bin/python3 tests/integration/test_ha.py "$BUILD"
script "coordinators over a 1-member etcd, ASan + UBSan (3-refit soak: the leader killed between Commit and Publish, in-refit, at random)" \
	env REFIT_HA_ROUNDS=3 REFIT_HA_HOLD_PUBLISH_MS=1000 REFIT_HA_ETCD=1 /usr/bin/python3 tests/integration/test_ha.py "$BUILD/asan"
script "leases across stalls (coordinator SIGSTOPped for 3 leases, mid-refit too; a stopped node still expires)" \
	/usr/bin/python3 tests/integration/test_lease.py "$BUILD"
script "leases across stalls, ASan + UBSan" \
	/usr/bin/python3 tests/integration/test_lease.py "$BUILD/asan"
script "bounded memory (refit records kept to refit_records and freed; a restart with a smaller bound)" \
	/usr/bin/python3 tests/integration/test_bounds.py "$BUILD"
script "bounded memory, ASan + UBSan" \
	/usr/bin/python3 tests/integration/test_bounds.py "$BUILD/asan"
script "trigger policy (on_ready, coalescing, min_interval_ms, manual, across a restart)" \
	/usr/bin/python3 tests/integration/test_trigger.py "$BUILD"
script "trigger policy, ASan + UBSan" \
	/usr/bin/python3 tests/integration/test_trigger.py "$BUILD/asan"
script "failure attribution and connect deadlines (an unreachable data port, a stopped sender)" \
	/usr/bin/python3 tests/integration/test_attribution.py "$BUILD"
script "failure attribution, ASan + UBSan (2 tries)" \
	/usr/bin/python3 tests/integration/test_attribution.py "$BUILD/asan" 2
script "network faults (nodes in network namespaces: delay + loss, partitions mid-refit with and without retries, an unreachable data port, the coordinator's link flapping; skipped only without root or namespaces)" \
	/usr/bin/python3 tests/integration/test_netfaults.py "$BUILD"
script "nccl on the CUDA + NCCL emulator (its rules, gpu-test, e2e and faults over nccl, normal and ASan)" \
	sh tests/run-check-nccl.sh "$BUILD"
script "fuzz ($FUZZ_RUNS inputs per harness, fixed seed)" \
	sh tests/fuzz/run.sh "$BUILD" 0 "$FUZZ_RUNS"
gpu "GPU tests (tests/gpu/run.sh: skipped only where no GPU is)" sh tests/gpu/run.sh "$BUILD"

script "scale (100 node daemons, every join order, SliceDone, SIGTERM with a stopped node)" \
	/usr/bin/python3 tests/integration/test_scale.py "$BUILD" 100
script "conversion kernels on the GPU vs the host (skipped without one)" \
	"$BUILD/tests/cvt-gpu-test" "$BUILD/lib/librefit-convert-cuda.so"
script "conversion end to end (fp32 -> bf16/fp16, bf16/fp16 -> fp8 with block and tensor scales, vs numpy; each refit again as delta)" \
	/usr/bin/python3 tests/integration/test_conversion.py "$BUILD"
script "conversion end to end, ASan + UBSan" \
	/usr/bin/python3 tests/integration/test_conversion.py "$BUILD/asan"

script "frameworks end to end (Megatron TP2xPP2 -> vLLM and SGLang TP4 in their own memory, byte for byte against the engines' own loaders and the fp8 quantizer; bad maps refused)" \
	/usr/bin/python3 tests/integration/test_frameworks.py "$BUILD"
script "a real engine: vLLM's CPU build (TP 2, a node per worker) serves refits from an FSDP2 + TP trainer (4 gloo processes) through refit.vllm and refit.torch; byte for byte, logprobs vs transformers; a Publish lost on one worker's node delays the version, never mixes" \
	/usr/bin/python3 tests/integration/test_engine.py "$BUILD" 4
script "a real engine: SGLang's CPU engine (TP 1 and 2) serves refits through refit.sglang; byte for byte through get_weights_by_name, greedy vs transformers (SKIP without sgl_kernel's CPU build, REFIT_SGL_KERNEL_CPU)" \
	/usr/bin/python3 tests/integration/test_sglang_engine.py "$BUILD"
# about 30 s (3 processes at most; starts daemons: not in the second lane)
script "refit.torch.Publisher(framework=\"megatron\"): a Megatron-Core GPTModel's (TP 1, TP 2, PP 2) fused QKV and gate/up refit into Hugging Face tensors byte for byte; publish(wait=...)" \
	"$BUILD/venv-megatron/bin/python" tests/frameworks/test_megatron_publisher.py "$BUILD"
script "librefit stands alone (exported symbols, soname, pkg-config, static)" \
	sh tests/librefit/run.sh "$BUILD"
script "Python package (torch trainer + inference examples as processes, DTensor-like layouts, pip install)" \
	/usr/bin/python3 tests/integration/test_python.py "$BUILD"
script "operations (/metrics + promtool, grpc health, systemd watchdog, JSON logs)" \
	/usr/bin/python3 tests/integration/test_ops.py "$BUILD"
script "operations, ASan + UBSan" /usr/bin/python3 tests/integration/test_ops.py "$BUILD/asan"
wait "$lane2_pid"
echo "== the second lane (run beside the suites above)"
cat "$LANE2/out"
cat "$LANE2/check.log" >>"$CHECK_LOG" 2>/dev/null
if read -r p f s <"$LANE2/totals" 2>/dev/null; then
	check_add "$p" "$f"
	total_skip=$((total_skip + s))
else
	echo "FAIL the second lane ended without its totals"
	check_add 0 1
fi
[ "$total_skip" -gt 0 ] && echo "($total_skip suite(s) skipped: see above why)"
echo "(the whole suite: $(( $(date +%s) - check_start )) s)"
echo "check: $total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
