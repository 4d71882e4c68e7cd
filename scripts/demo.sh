#!/bin/sh
# `make demo` until the daemon exists: the planner end to end on the
# example model in config/examples (a small Llama-like model trained with
# TP2 x PP2 x DP2 on 8 ranks, served by two TP4 replicas on 8 ranks).
set -eu
BIN=${1:-build/bin/refit-plan}
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

printf '\nThe coordinator and node daemons exist (README.md, docs/control-plane.md);\n'
printf 'the data plane does not yet, so this demo runs the planner offline.\n'
