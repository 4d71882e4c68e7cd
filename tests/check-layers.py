#!/usr/bin/python3
"""check-layers.py BUILD [FOLDER...] - no file-level call cycles inside a folder.

For each folder (default: plan, daemon/coord, daemon/node, rpc, daemon/transport)
the file-level call graph is read from the built objects with nm: file A
calls file B when A's object leaves undefined a function that B's object
defines (non-static functions; static ones never cross a file).  Global
data is not counted: a registry's table of another file's ops (transport.c
naming xport_tcp_ops) is how a lower file is plugged in, not a call.  A
cycle (A -> B -> ... -> A) fails, naming its files and, for each edge, the
functions called.  A passing folder prints its files in an order where
each calls only those after it (files in one layer, by commas, do not
call each other).  Ends with "N passed, N failed" (one per
folder, one for a self-test on three small files compiled here).  Run
after the build: tests/run-check.sh does.
"""
import os
import subprocess
import sys
import tempfile

FOLDERS = ["plan", "daemon/coord", "daemon/node", "rpc", "daemon/transport"]


def symbols(obj):
    """(defined non-static functions, undefined symbols) of one object."""
    out = subprocess.run(["nm", "-P", obj], check=True, capture_output=True,
                         text=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        f = line.split()
        if len(f) < 2:
            continue
        if f[1] in "TW":
            defined.add(f[0])
        elif f[1] == "U":
            undefined.add(f[0])
    return defined, undefined


def graph(objdir, folder):
    """{file: {callee file: sorted function names}} for the folder's sources,
    their objects in objdir."""
    srcs = sorted(s for s in os.listdir(folder) if s.endswith(".c"))
    syms = {}
    for s in srcs:
        obj = os.path.join(objdir, s[:-2] + ".o")
        if not os.path.exists(obj):
            raise FileNotFoundError("%s: no object %s (build first)" % (folder, obj))
        syms[s] = symbols(obj)
    owner = {}
    for s in srcs:
        for name in syms[s][0]:
            owner[name] = s
    edges = {s: {} for s in srcs}
    for s in srcs:
        for name in syms[s][1]:
            t = owner.get(name)
            if t is not None and t != s:
                edges[s].setdefault(t, []).append(name)
    for s in srcs:
        for t in edges[s]:
            edges[s][t].sort()
    return edges


def cycles(edges):
    """Strongly connected components of more than one file (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def order(edges):
    """The files by layer (the graph is acyclic): a file's layer is the
    longest chain of calls reaching it, so each calls only later layers."""
    depth = {}

    def visit(v, d):
        if depth.get(v, -1) >= d:
            return
        depth[v] = d
        for w in edges[v]:
            visit(w, d + 1)

    for v in sorted(edges):
        if not any(v in edges[u] for u in edges):
            visit(v, 0)
    layers = {}
    for v, d in depth.items():
        layers.setdefault(d, []).append(v)
    return [", ".join(sorted(layers[d])) for d in sorted(layers)]


SELFTEST = {
    "a.c": "void b(void); void a(void) { b(); }\n",
    "b.c": "void a(void); static void s(void) {} void b(void) { s(); a(); }\n",
    "c.c": "void a(void); void c(void) { a(); }\n",
}


def selftest():
    """The check itself: a.c <-> b.c is a cycle, c.c -> a.c is not, b.c's
    static s() is no file's; None, or what went wrong."""
    with tempfile.TemporaryDirectory(prefix="check-layers.") as d:
        for name, text in SELFTEST.items():
            with open(os.path.join(d, name), "w") as f:
                f.write(text)
            subprocess.run([os.environ.get("CC", "cc"), "-c", "-o",
                            os.path.join(d, name[:-2] + ".o"), os.path.join(d, name)],
                           check=True)
        edges = graph(d, d)
    want = {"a.c": {"b.c": ["b"]}, "b.c": {"a.c": ["a"]}, "c.c": {"a.c": ["a"]}}
    if edges != want:
        return "graph %r, not %r" % (edges, want)
    if cycles(edges) != [["a.c", "b.c"]]:
        return "cycles %r, not [['a.c', 'b.c']]" % cycles(edges)
    return None


def main():
    if len(sys.argv) < 2:
        print("usage: check-layers.py BUILD [FOLDER...]", file=sys.stderr)
        return 2
    build = sys.argv[1]
    folders = sys.argv[2:] or FOLDERS
    passed = failed = 0
    try:
        why = selftest()
    except (OSError, subprocess.CalledProcessError) as e:
        why = str(e)
    if why:
        print("FAIL self-test: %s" % why)
        failed += 1
    else:
        print("ok self-test: a cycle of two files is found, a call into it is not one")
        passed += 1
    for folder in folders:
        try:
            edges = graph(os.path.join(build, "obj", folder), folder)
        except (OSError, subprocess.CalledProcessError) as e:
            print("FAIL %s: %s" % (folder, e))
            failed += 1
            continue
        bad = cycles(edges)
        if not bad:
            print("ok %s: %s" % (folder, " -> ".join(order(edges))))
            passed += 1
            continue
        for comp in bad:
            print("FAIL %s: files calling each other (a cycle): %s"
                  % (folder, ", ".join(comp)))
            for a in comp:
                for b in comp:
                    if b in edges[a]:
                        print("  %s -> %s: %s" % (a, b, ", ".join(edges[a][b])))
        failed += 1
    print("layers: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
