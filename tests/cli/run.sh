#!/bin/sh
# CLI tests for refit-plan, and for refitctl where no coordinator is needed
# (refitctl against a coordinator: tests/integration/test_control_plane.py):
# exit codes, error messages, output formats.
# Usage: run.sh path/to/refit-plan (refitctl is taken from the same folder).
# Prints "cli: N passed, N failed".
set -u
BIN=$1
EX=config/examples
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
passed=0
failed=0

# expect NAME EXIT SUBSTRING -- CMD...  (SUBSTRING searched in stdout+stderr)
expect() {
	name=$1 want=$2 sub=$3
	shift 4
	"$@" >"$TMP/out" 2>&1
	got=$?
	if [ "$got" -ne "$want" ]; then
		echo "FAIL $name: exit $got, expected $want"; sed 's/^/    /' "$TMP/out" | head -5
		failed=$((failed + 1)); return
	fi
	if [ -n "$sub" ] && ! grep -qF -- "$sub" "$TMP/out"; then
		echo "FAIL $name: output lacks \"$sub\""; sed 's/^/    /' "$TMP/out" | head -5
		failed=$((failed + 1)); return
	fi
	passed=$((passed + 1))
}

P="--src $EX/train-tp2pp2dp2.json --dst $EX/infer-tp4x2.json --topology $EX/topology-small.json"

expect help 0 "refit planner" -- "$BIN" --help
expect help-cmd 0 "--chunk-bytes" -- "$BIN" help plan
expect boxes-help 0 "local_offset" -- "$BIN" boxes --help
expect no-args 2 "usage:" -- "$BIN"
expect unknown-cmd 2 "unknown command \"frobnicate\"" -- "$BIN" frobnicate
expect boxes 0 '{"rank": 4, "offset": [64, 0, 0], "size": [64, 4096, 1536]}' -- "$BIN" boxes $EX/layout-dtensor.json
expect boxes-strided 0 '{"rank": 1, "offset": [8, 0], "size": [4, 8]}' -- "$BIN" boxes $EX/layout-fsdp-tp.json
expect boxes-list 0 '{"tensors": [' -- "$BIN" boxes $EX/train-tp2pp2dp2.json
expect boxes-missing 2 "nope.json: No such file or directory" -- "$BIN" boxes "$TMP/nope.json"
printf '{"name": "w", "dtype": "bf16", "shape": [4], "mesh": [0, 1], "placements": ["Shard(1)"]}' >"$TMP/bad.json"
expect boxes-bad-dim 2 'bad.json: layout "w": placement 0 "Shard(1)" names dim 1 but the tensor has 1 dims' -- "$BIN" boxes "$TMP/bad.json"
printf '{"name": "w", "dtype": "bf16",' >"$TMP/trunc.json"
expect boxes-malformed 2 "malformed JSON near line 1" -- "$BIN" boxes "$TMP/trunc.json"
expect plan 0 "validated: every needed element arrives exactly once" -- "$BIN" plan $P
expect plan-json 0 '"transfers": [' -- "$BIN" plan $P --json
expect plan-broadcast 0 "(broadcast)" -- "$BIN" plan $P --mode broadcast --staging-bytes 64K --chunk-bytes 16K
expect plan-preset 0 "topology: 16 ranks, 2 nodes" -- "$BIN" plan $P --topology dgx-h100:16
expect plan-bad-mode 2 '--mode "fast": expected reshard or broadcast' -- "$BIN" plan $P --mode fast
expect plan-bad-size 2 '--chunk-bytes: "4Q" is not a size' -- "$BIN" plan $P --chunk-bytes 4Q
expect plan-missing-arg 2 "--src, --dst and --topology are required" -- "$BIN" plan --src $EX/train-tp2pp2dp2.json
expect plan-small-topo 2 'rank 8 is not in the topology (8 ranks)' -- "$BIN" plan $P --topology dgx-h100:8
expect plan-bad-preset 2 'unknown preset' -- "$BIN" plan $P --topology dgx-a100:8
expect plan-mismatch 2 'is in the destination but not in the source' -- "$BIN" plan --src $EX/layout-dtensor.json --dst $EX/infer-tp4x2.json --topology dgx-h100:16
expect explain 0 "reshard speed-up" -- "$BIN" explain $P
expect explain-json 0 '"broadcast": {"digest"' -- "$BIN" explain $P --json

C="--src $EX/convert-src.json --dst $EX/convert-dst-fp8.json --topology dgx-h100:16"
expect explain-convert 0 "conversion: 3 tensors (2 on the senders, 1 on the receivers)" -- "$BIN" explain $C
expect plan-convert 0 "network 1.99 MiB -> 1.48 MiB" -- "$BIN" plan $C
sed 's/"shape": \[8, 4\], "mesh": \[8, 9\], "placements": \["Replicate()"\]/"shape": [8, 3], "mesh": [8, 9], "placements": ["Replicate()"]/' $EX/convert-dst-fp8.json >"$TMP/conv-bad.json"
expect plan-convert-scale-shape 2 'scale tensor "v_scale_inv" must be fp32 of shape [8, 4]' -- "$BIN" plan --src $EX/convert-src.json --dst "$TMP/conv-bad.json" --topology dgx-h100:16
expect model-fp8 0 "network bytes x0.5" -- "$BIN" model --model qwen3-30b-a3b --train tp2,pp2,ep8 --infer tp4,dp8 --infer-dtype fp8-block128
expect model-fp8-bad 2 '--infer-dtype "fp4": expected same, fp8-block128 or fp8-tensor' -- "$BIN" model --model qwen3-30b-a3b --train tp2,pp2,ep8 --infer tp4,dp8 --infer-dtype fp4

expect model 0 "reshard speed-up" -- "$BIN" model --model llama-3-70b --train tp8,pp4,dp2 --infer tp16,dp4
expect model-json 0 '"model": "qwen3-30b-a3b"' -- "$BIN" model --model qwen3-30b-a3b --train tp2,pp2,ep8 --infer tp4,dp8 --json
expect model-placement 0 "placement rack-aligned, 36 nodes, 2 domains, 80 idle ranks" -- "$BIN" model --model qwen3-30b-a3b --train tp2,pp2,ep8 --infer tp16,dp2 --topology gb200-nvl72
expect model-packed 0 "placement packed, 16 nodes, 1 domains, 0 idle ranks" -- "$BIN" model --model qwen3-30b-a3b --train tp2,pp2,ep8 --infer tp16,dp2 --topology gb200-nvl72 --placement packed
expect model-placement-json 0 '"placement": "packed"' -- "$BIN" model --model qwen3-30b-a3b --train tp2,pp2,ep8 --infer tp4,dp8 --json
expect model-bad-placement 2 '--placement "spread": expected packed or rack-aligned' -- "$BIN" model --model qwen3-30b-a3b --train tp2,pp2,ep8 --infer tp4,dp8 --placement spread
expect model-sized-topo 2 'give the preset name only' -- "$BIN" model --model qwen3-30b-a3b --train tp2,pp2,ep8 --infer tp4,dp8 --topology dgx-h100:64
expect model-baseline 0 "against gather-and-broadcast at its best chunk" -- "$BIN" model --model qwen3-30b-a3b --train tp2,pp2,ep8 --infer tp4,dp8 --baseline-chunks 1MiB,16MiB
expect model-baseline-json 0 '"broadcast_best": {"chunk_bytes": ' -- "$BIN" model --model qwen3-30b-a3b --train tp2,pp2,ep8 --infer tp4,dp8 --baseline-chunks 64MiB --json
expect model-bad-baseline 2 '--baseline-chunks: "4Q" is not a size' -- "$BIN" model --model qwen3-30b-a3b --train tp2,pp2,ep8 --infer tp4,dp8 --baseline-chunks 1MiB,4Q
expect model-validate 0 "validated: every needed element arrives exactly once" -- "$BIN" model --model qwen3-30b-a3b --train tp2,pp2,ep8 --infer tp16,dp2 --topology gb200-nvl72 --baseline-chunks 4MiB --validate
expect model-explain 0 "busiest resource: network" -- "$BIN" model --model qwen3-30b-a3b --train tp2,pp2,ep8 --infer tp8,dp4 --topology gb200-nvl72 --baseline-chunks 4MiB --explain
expect model-delta 0 "delta stops paying at density" -- "$BIN" model --model qwen3-30b-a3b --train tp2,pp2,ep8 --infer tp4,dp8 --baseline-chunks 4MiB --delta-density 3%
expect model-delta-bad 2 '--delta-density "1.5": expected a share' -- "$BIN" model --model qwen3-30b-a3b --train tp2,pp2,ep8 --infer tp4,dp8 --delta-density 1.5
expect model-delta-codec-bad 2 '--delta-codec "5": expected ENCODE,DECODE' -- "$BIN" model --model qwen3-30b-a3b --train tp2,pp2,ep8 --infer tp4,dp8 --delta-density 0.03 --delta-codec 5
expect model-unknown 2 'model "gpt-9": no such file' -- "$BIN" model --model gpt-9 --train tp8 --infer tp8
expect model-bad-spec 2 'parallel spec "tp8,zz2"' -- "$BIN" model --model llama-3-70b --train tp8,zz2 --infer tp8

# the same inputs give the same digest, run after run
"$BIN" plan $P --json | head -1 >"$TMP/d1"
"$BIN" plan $P --json | head -1 >"$TMP/d2"
expect digest-stable 0 "" -- cmp "$TMP/d1" "$TMP/d2"
# JSON output is well-formed, where a Python is at hand to say so
if [ -x /usr/bin/python3 ]; then
	"$BIN" plan $P --json >"$TMP/plan.json"
	expect json-valid 0 "" -- /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['transfers'] and len(d['digest']) == 64" "$TMP/plan.json"
	"$BIN" model --model qwen3-30b-a3b --train tp2,pp2,ep8 --infer tp16,dp2 --topology gb200-nvl72 --baseline-chunks 1MiB,64MiB --json >"$TMP/model.json"
	expect model-json-valid 0 "" -- /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); b=d['broadcast_best']; assert d['placement'] == 'rack-aligned' and d['idle_ranks'] == 80 and b['cost']['time_s'] <= d['broadcast']['time_s'] and b['chunk_bytes'] in (1<<20, 4<<20, 64<<20)" "$TMP/model.json"
	"$BIN" model --model qwen3-30b-a3b --train tp2,pp2,ep8 --infer tp4,dp8 --baseline-chunks 4MiB --delta-density 0.03 --delta-codec 1000,1000 --json >"$TMP/delta.json"
	expect model-delta-json 0 "" -- /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); x=d['delta']; r=d['reshard']; assert 0.04 < x['network_share'] < 0.06 and x['network_bytes'] < 0.06 * r['network_bytes'] and x['time_s'] < r['time_s'] and x['codec_free']['time_s'] <= x['time_s'] and 0.5 < x['breakeven_density']['network_bytes'] < 1, x" "$TMP/delta.json"
	"$BIN" model --model qwen3-30b-a3b --train tp2,pp2,ep8 --infer tp8,dp4 --topology gb200-nvl72 --baseline-chunks 4MiB --explain --json >"$TMP/explain.json"
	expect model-explain-json 0 "" -- /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); x=d['explain']; assert x['resource'] in ('net_tx', 'net_rx') and x['messages'] > 0 and abs(x['bytes_s'] + x['latency_s'] + x['other_s'] + x['fill_s'] - d['reshard']['time_s']) < 1e-6 * d['reshard']['time_s'], x" "$TMP/explain.json"
	"$BIN" boxes $EX/train-tp2pp2dp2.json >"$TMP/boxes.json"
	expect boxes-valid 0 "" -- /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert len(d['tensors']) == 23" "$TMP/boxes.json"
	# names from the user's files are escaped in JSON
	sed 's/"name": "llama-3-70b"/"name": "l\\"q\\\\x"/' config/models/llama-3-70b.json >"$TMP/quoted.json"
	"$BIN" model --model "$TMP/quoted.json" --train tp8,pp4 --infer tp8,dp4 --json >"$TMP/quoted.out"
	expect model-json-escaped 0 "" -- /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['model'] == 'l\"q\\\\x', d['model']" "$TMP/quoted.out"
fi

# refitctl without a coordinator: usage and argument errors exit 2 before
# any call, an unreachable coordinator 3
CTL=$(dirname "$BIN")/refitctl
if [ -x "$CTL" ]; then
	NOWHERE="--coordinator 127.0.0.1:1 --timeout-ms 2000"
	expect ctl-help 0 "trigger MODEL [--version N]" -- "$CTL" --help
	expect ctl-no-cmd 2 "usage: refitctl" -- "$CTL"
	expect ctl-unknown 2 'unknown command "frob"' -- "$CTL" $NOWHERE frob
	expect ctl-model-args 2 "usage: refitctl model NAME" -- "$CTL" $NOWHERE model
	expect ctl-list-args 2 "usage: refitctl list [MODEL]" -- "$CTL" $NOWHERE list a b
	expect ctl-status-id 2 'refit id: "x" is not' -- "$CTL" $NOWHERE status x
	expect ctl-abort-id 2 'refit id: "0" is not a whole number from 1' -- "$CTL" $NOWHERE abort 0
	expect ctl-unregister-empty 2 "usage: refitctl unregister MODEL INSTANCE" -- "$CTL" $NOWHERE unregister m ""
	expect ctl-trigger-mode 2 '--mode "fast": reshard or broadcast' -- "$CTL" $NOWHERE trigger m --mode fast
	expect ctl-trigger-option 2 "usage: refitctl trigger MODEL" -- "$CTL" $NOWHERE trigger m --bogus
	# policy options are checked before the coordinator is asked for the policy
	expect ctl-policy-retries 2 '--retries: "many"' -- "$CTL" $NOWHERE policy m --retries many
	expect ctl-policy-catch-up 2 '--catch-up takes on or off, not "maybe"' -- "$CTL" $NOWHERE policy m --catch-up maybe
	expect ctl-timeout 2 "--timeout-ms" -- "$CTL" --timeout-ms 0 members
	printf '\n \r\n' >"$TMP/empty-token"
	expect ctl-token-empty 2 "empty-token: the token file is empty" -- "$CTL" $NOWHERE --token-file "$TMP/empty-token" members
	expect ctl-token-missing 2 "nope-token: No such file" -- "$CTL" $NOWHERE --token-file "$TMP/nope-token" members
	expect ctl-unreachable 3 "is a coordinator running at" -- "$CTL" $NOWHERE members
	# init calls nothing: no coordinator needed; never over an existing file
	expect ctl-init-args 2 "usage: refitctl init DIR" -- "$CTL" $NOWHERE init
	expect ctl-init 0 "join.token" -- "$CTL" $NOWHERE init "$TMP/secrets"
	expect ctl-init-again 2 "File exists (kept" -- "$CTL" $NOWHERE init "$TMP/secrets"
fi

echo "cli: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
