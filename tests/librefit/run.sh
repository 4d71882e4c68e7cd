#!/bin/sh
# tests/librefit/run.sh BUILD: librefit stands alone.
#  - librefit.so and librefit.a define, as global symbols, exactly the
#    functions of client/refit.h (nm -D --defined-only / nm -g --defined-only):
#    anything else (xmalloc, log_*, strbuf_*, rpc_*, refit_err_*) fails
#  - its soname is versioned (librefit.so.N)
#  - `make install-librefit DESTDIR=...` installs the library, header and
#    refit.pc; a program built with `pkg-config --cflags --libs refit`
#    (shared) and `pkg-config --static` links and runs
# Ends with "librefit: N passed, N failed".
set -u
BUILD=${1:-build}
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
TMP=$(mktemp -d /tmp/refit-lib-XXXXXX)
trap 'rm -rf "$TMP"' EXIT

# the public functions: every "refit_xxx(" declared in the header
grep -o '^[a-z].* \**refit_[a-z0-9_]*(' client/refit.h | sed 's/.*\(refit_[a-z0-9_]*\)(/\1/' |
	sort -u >"$TMP/api"
[ -s "$TMP/api" ] || { bad "no functions found in client/refit.h"; }

# exports SYMFILE LABEL: the defined global symbols listed must be the API
exports() {
	if ! cmp -s "$1" "$TMP/api"; then
		bad "$2 exports exactly refit.h's functions; differences (< exported, > refit.h):"
		diff "$1" "$TMP/api" | sed 's/^/     /' | head -20
	else
		ok "$2 exports exactly refit.h's $(wc -l <"$TMP/api") functions"
	fi
}
if nm -D --defined-only "$BUILD/lib/librefit.so" >"$TMP/nm.so"; then
	# the version node (absolute symbol REFIT_1) is no function
	awk '$2 != "A" {sub(/@.*/, "", $3); print $3}' "$TMP/nm.so" | sort -u >"$TMP/so"
	exports "$TMP/so" "librefit.so"
else
	bad "nm -D $BUILD/lib/librefit.so"
fi
if nm -g --defined-only "$BUILD/lib/librefit.a" >"$TMP/nm.a"; then
	awk 'NF == 3 {print $3}' "$TMP/nm.a" | sort -u >"$TMP/a"
	exports "$TMP/a" "librefit.a"
else
	bad "nm -g $BUILD/lib/librefit.a"
fi
soname=$(readelf -d "$BUILD/lib/librefit.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
case "$soname" in
librefit.so.[0-9]*) ok "soname is versioned ($soname)" ;;
*) bad "soname \"$soname\" is not librefit.so.N" ;;
esac

# installed, found by pkg-config, linked and run
cat >"$TMP/prog.c" <<'EOC'
#include <refit.h>
#include <stdio.h>
#include <string.h>
int main(void)
{
	char err[256];
	refit_t *h = NULL;
	void *p = NULL;
	int rc = refit_shm_create("pkgconfig-test", 4096, &p, err, sizeof(err));

	if (rc != 0 || p == NULL) {
		printf("shm_create: %s\n", err);
		return 1;
	}
	memset(p, 7, 4096);
	rc = refit_open("/nonexistent/refit.sock", 500, &h, err, sizeof(err));
	if (rc == 0 || h != NULL) {
		printf("open of a missing socket succeeded\n");
		return 1;
	}
	printf("open failed as it should: %s: %s\n", refit_status_name(rc), err);
	return 0;
}
EOC
DEST=$TMP/dest
if make --no-print-directory -s install-librefit BUILD="$BUILD" DESTDIR="$DEST" \
	PREFIX=/usr/local REFIT_NO_DEPS=1 >"$TMP/install.log" 2>&1; then
	ok "make install-librefit installs into DESTDIR"
else
	bad "make install-librefit"; cat "$TMP/install.log"
fi
for f in lib/librefit.so lib/librefit.so.1 lib/librefit.a lib/pkgconfig/refit.pc include/refit.h; do
	[ -e "$DEST/usr/local/$f" ] || bad "installed $f missing"
done
export PKG_CONFIG_PATH="$DEST/usr/local/lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$DEST"
if flags=$(pkg-config --cflags --libs refit) &&
	cc -o "$TMP/prog" "$TMP/prog.c" $flags >"$TMP/cc.log" 2>&1 &&
	LD_LIBRARY_PATH="$DEST/usr/local/lib" "$TMP/prog" >"$TMP/run.log" 2>&1 &&
	grep -q "open failed as it should" "$TMP/run.log"; then
	ok "a program built with pkg-config --cflags --libs refit links librefit.so and runs"
else
	bad "pkg-config build ($flags)"; cat "$TMP/cc.log" "$TMP/run.log" 2>/dev/null
fi
# the program sees only refit_* from librefit (its undefined symbols there)
if nm -D --undefined-only "$TMP/prog" 2>/dev/null | grep -q 'refit_shm_create'; then
	ok "the program takes refit_* from librefit.so"
else
	bad "the program does not import refit_shm_create dynamically"
fi
if sflags=$(pkg-config --static --cflags --libs refit) &&
	cc -o "$TMP/prog-static" "$TMP/prog.c" "$DEST/usr/local/lib/librefit.a" \
		$(echo "$sflags" | sed 's/-lrefit//') >"$TMP/ccs.log" 2>&1 &&
	"$TMP/prog-static" >"$TMP/runs.log" 2>&1; then
	ok "a program linked with librefit.a (pkg-config --static) runs"
else
	bad "static link"; cat "$TMP/ccs.log" "$TMP/runs.log" 2>/dev/null
fi
echo "librefit: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
