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

script "the check runner counts crashes and missing result lines" sh tests/check-selftest.sh
script "layers: no file-level call cycles in plan, daemon/coord, daemon/node, rpc, daemon/transport" \
	/usr/bin/python3 tests/check-layers.py "$BUILD"
script "figures: scripts/figures.py rewrites only its regions, fails and skips cleanly" \
	/usr/bin/python3 tests/check-figures.py
unit "unit tests" "$BUILD/tests/unit"
script "CLI tests" sh tests/cli/run.sh "$BUILD/bin/refit-plan"
unit "unit tests, ASan + UBSan" "$BUILD/asan/tests/unit"
script "CLI tests, ASan + UBSan" sh tests/cli/run.sh "$BUILD/asan/bin/refit-plan"
script "control plane (coordinator + Python gRPC + refitctl)" \
	/usr/bin/python3 tests/integration/test_control_plane.py "$BUILD"
script "control plane, ASan + UBSan" \
	/usr/bin/python3 tests/integration/test_control_plane.py "$BUILD/asan"
script "who may call what (a join token; rogues without it and acting for another node refused, nothing changed; SIGHUP rotation; secure by default)" \
	/usr/bin/python3 tests/integration/test_auth.py "$BUILD"
script "who may call what, ASan + UBSan" \
	/usr/bin/python3 tests/integration/test_auth.py "$BUILD/asan"
script "data plane (coordinator + 6 nodes + librefit clients, 50 layout pairs)" \
	/usr/bin/python3 tests/integration/test_dataplane.py "$BUILD" 50
script "data plane, ASan + UBSan (8 layout pairs)" \
	/usr/bin/python3 tests/integration/test_dataplane.py "$BUILD/asan" 8
script "faults (SIGKILL, SIGSTOP, cut links, retry, catch-up, restarts, drain, 30 s soak)" \
	/usr/bin/python3 tests/integration/test_faults.py "$BUILD" 30
script "faults, ASan + UBSan (5 s soak)" \
	/usr/bin/python3 tests/integration/test_faults.py "$BUILD/asan" 5
script "coordinators over etcd (standbys, leader SIGKILLed and SIGSTOPped, a 6-refit kill soak, etcd stopped; ~45 s)" \
	/usr/bin/python3 tests/integration/test_ha.py "$BUILD"
script "coordinators over etcd, ASan + UBSan (2-refit soak)" \
	env REFIT_HA_ROUNDS=2 /usr/bin/python3 tests/integration/test_ha.py "$BUILD/asan"
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
script "conversion: C vs the numpy reference" /usr/bin/python3 tests/conversion/test_ref.py "$BUILD"
script "conversion kernels on the GPU vs the host (skipped without one)" \
	"$BUILD/tests/cvt-gpu-test" "$BUILD/lib/librefit-convert-cuda.so"
script "conversion end to end (fp32 -> bf16/fp16, bf16/fp16 -> fp8 with block and tensor scales, vs numpy)" \
	/usr/bin/python3 tests/integration/test_conversion.py "$BUILD"
script "conversion end to end, ASan + UBSan" \
	/usr/bin/python3 tests/integration/test_conversion.py "$BUILD/asan"

script "frameworks end to end (Megatron TP2xPP2 -> vLLM and SGLang TP4 in their own memory, byte for byte against the engines' own loaders and the fp8 quantizer; bad maps refused)" \
	/usr/bin/python3 tests/integration/test_frameworks.py "$BUILD"
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
script "refit.vllm refuses by name the engines it cannot serve exactly (CUDA workers, quantization, PP/DP, a parameter either side lacks, a shape)" \
	"$BUILD/venv-vllmcpu/bin/python" tests/frameworks/test_vllm_refusals.py "$BUILD"
script "a real engine: vLLM's CPU build (TP 2) serves refits from an FSDP2 + TP trainer (4 gloo processes) through refit.vllm and refit.torch; byte for byte, logprobs vs transformers" \
	/usr/bin/python3 tests/integration/test_engine.py "$BUILD" 4
script "librefit stands alone (exported symbols, soname, pkg-config, static)" \
	sh tests/librefit/run.sh "$BUILD"
script "Python package (torch trainer + inference examples as processes, DTensor-like layouts, pip install)" \
	/usr/bin/python3 tests/integration/test_python.py "$BUILD"
script "operations (/metrics + promtool, grpc health, systemd watchdog, JSON logs)" \
	/usr/bin/python3 tests/integration/test_ops.py "$BUILD"
script "operations, ASan + UBSan" /usr/bin/python3 tests/integration/test_ops.py "$BUILD/asan"
[ "$total_skip" -gt 0 ] && echo "($total_skip suite(s) skipped: see above why)"
echo "check: $total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
