#!/bin/sh
# `make demo` until the daemon exists: the planner end to end on the
# example model in config/examples (a small Llama-like model trained with
# TP2 x PP2 x DP2 on 8 ranks, served by two TP4 replicas on 8 ranks).
set -eu
BIN=${1:-build/bin/refit-plan}
BINDIR=$(dirname "$BIN")
EX=config/examples
P="--src $EX/train-tp2pp2dp2.json --dst $EX/infer-tp4x2.json --topology $EX/topology-small.json"

step() { printf '\n\033[1m== %s\033[0m\n$ %s\n' "$1" "$2"; }

step "1. where a DTensor's shards live (FSDP2 + TP, _StridedShard)" \
     "refit-plan boxes $EX/layout-fsdp-tp.json"
"$BIN" boxes $EX/layout-fsdp-tp.json

step "2. plan the refit of 23 tensors, TP2xPP2xDP2 -> 2 x TP4, and validate it" \
     "refit-plan plan $P"
"$BIN" plan $P

step "3. the first transfers of that plan, as JSON" "refit-plan plan ... --json | head"
"$BIN" plan $P --json | head -6

step "4. reshard next to gather-and-broadcast" "refit-plan explain $P"
"$BIN" explain $P

step "5. the same on two DGX H100 nodes per side (topology preset)" \
     "refit-plan explain ... --topology dgx-h100:16"
"$BIN" explain --src $EX/train-tp2pp2dp2.json --dst $EX/infer-tp4x2.json --topology dgx-h100:16

step "6. a whole model: DeepSeek-V3, PP16 x EP16 training -> 8 x TP32 inference" \
     "refit-plan model --model deepseek-v3 --train pp16,ep16 --infer tp32,dp8"
"$BIN" model --model deepseek-v3 --train pp16,ep16 --infer tp32,dp8

step "7. the control plane: a coordinator and three node daemons" \
     "refitd --role coordinator ...; refitd --role node ... (x3); refitctl members"
RUN=$(mktemp -d /tmp/refit-demo.XXXXXX)
PIDS=""
cleanup() {
	for p in $PIDS; do kill "$p" 2>/dev/null || true; done
	for p in $PIDS; do wait "$p" 2>/dev/null || true; done
	rm -rf "$RUN"
}
trap cleanup EXIT INT TERM
"$BINDIR/refitd" --role coordinator --listen "unix:$RUN/coord.sock" \
	--log-level warn 2>"$RUN/coord.log" &
PIDS="$PIDS $!"
for spec in train0:0-7 infer0:8-11 infer1:12-15; do
	node=${spec%%:*}
	"$BINDIR/refitd" --role node --node-id "$node" --ranks "${spec#*:}" \
		--listen "unix:$RUN/$node.sock" --coordinator "unix:$RUN/coord.sock" \
		--heartbeat-ms 200 --log-level warn 2>"$RUN/$node.log" &
	PIDS="$PIDS $!"
done
n=0
while [ $n -lt 50 ]; do
	if "$BINDIR/refitctl" --coordinator "unix:$RUN/coord.sock" members 2>/dev/null |
	   grep -q "3 members"; then
		break
	fi
	sleep 0.1
	n=$((n + 1))
done
"$BINDIR/refitctl" --coordinator "unix:$RUN/coord.sock" members

printf '\nThe data plane (transports, librefit) is not built yet, so weights do not\n'
printf 'move between these daemons: see README.md, "What exists today".\n'
