#!/bin/sh
# Install the PyPI packages the framework proofs need (tests/frameworks/):
# one virtual environment per section of python/frameworks.txt, made with
# Debian's /usr/bin/python3, never into Debian's Python.  Quiet when present.
#
# Each environment is built once per machine in a cache keyed by its
# section's text (REFIT_VENV_CACHE, default ~/.cache/refit/venvs: they are
# 5-11 GiB each, and a fresh clone's `make check` should not download and
# unpack them again), and BUILD/venv-NAME links to it.  A section that
# changes gets a new environment.  REFIT_NO_DEPS=1 skips this (offline).
set -eu
[ "${REFIT_NO_DEPS:-0}" = 1 ] && exit 0
BUILD=${1:-build}
PINS=python/frameworks.txt
CACHE=${REFIT_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/refit/venvs}
PY=/usr/bin/python3
mkdir -p "$BUILD" "$CACHE"
for name in $(sed -n 's/^\[\([a-z0-9-]*\)\]$/\1/p' "$PINS"); do
	reqs=$(awk -v s="[$name]" '$0 == s {on = 1; next} /^\[/ {on = 0}
		on && NF && $1 !~ /^#/' "$PINS")
	key=$(printf '%s\n%s\n' "$($PY --version 2>&1)" "$reqs" | sha256sum | cut -c1-12)
	dir=$CACHE/$name-$key
	if [ ! -f "$dir/.complete" ]; then
		echo "pydeps: installing the $name environment into $dir (once; minutes)"
		rm -rf "$dir"
		$PY -m venv "$dir"
		"$dir/bin/pip" install -q pip==26.3 >/dev/null
		plain=$(echo "$reqs" | grep -v '^--no-deps' || true)
		nodeps=$(echo "$reqs" | sed -n 's/^--no-deps[[:space:]]*//p')
		# shellcheck disable=SC2086
		"$dir/bin/pip" install -q $plain
		# shellcheck disable=SC2086
		[ -z "$nodeps" ] || "$dir/bin/pip" install -q --no-deps $nodeps
		touch "$dir/.complete"
	fi
	if [ "$(readlink "$BUILD/venv-$name" 2>/dev/null)" != "$dir" ]; then
		rm -rf "$BUILD/venv-$name"
		ln -s "$dir" "$BUILD/venv-$name"
	fi
done
