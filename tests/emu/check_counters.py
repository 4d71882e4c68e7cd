#!/usr/bin/python3
"""Leak check over the emulator's counter dumps (tests/emu/README.md).

Usage: check_counters.py REFIT_EMU_DIR [--allow FIELD ...]

Reads every $REFIT_EMU_DIR/counters/<pid>.json (written at exit by processes
run with REFIT_EMU_COUNTERS=1), prints one line per process with anything
left (allocations, IPC mappings, streams, communicators, unconsumed ids, a
sticky error) and a total line; exits 1 when something was left that
--allow does not name (fields: alloc, ipc, streams, comms, ids, sticky), 2
when there is no dump at all.  As a module: load(dir) -> list of dicts,
leaks(dump) -> {field: value}.
"""
import glob
import json
import os
import sys

FIELDS = ("alloc", "ipc", "streams", "comms", "ids", "sticky")


def load(emu_dir):
    out = []
    for path in sorted(glob.glob(os.path.join(emu_dir, "counters", "*.json"))):
        with open(path, encoding="utf-8") as f:
            out.append(json.load(f))
    return out


def leaks(d):
    """What a process left behind: {field: value}, empty when nothing."""
    left = {
        "alloc": sum(d.get("alloc_live", [])),
        "ipc": d.get("ipc_open", 0),
        "streams": d.get("streams_live", 0),
        "comms": d.get("comms_live", 0),
        "ids": d.get("ids_unconsumed", 0),
        "sticky": d.get("sticky", ""),
    }
    return {k: v for k, v in left.items() if v}


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    allow = set()
    args = argv[2:]
    while args:
        if args[0] != "--allow" or len(args) < 2 or args[1] not in FIELDS:
            print("check_counters: bad arguments %r (--allow one of %s)" % (args, FIELDS),
                  file=sys.stderr)
            return 2
        allow.add(args[1])
        args = args[2:]
    dumps = load(argv[1])
    if not dumps:
        print("counters: no dump under %s/counters" % argv[1])
        return 2
    bad = 0
    moved = 0
    for d in dumps:
        moved += sum(d.get("pair_bytes", {}).values())
        left = leaks(d)
        if left:
            print("counters: pid %s (host %s) left %s" % (d.get("pid"), d.get("host"), left))
        if set(left) - allow:
            bad += 1
    print("counters: %d processes, %d with leaks not allowed, %d bytes moved"
          % (len(dumps), bad, moved))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
