#!/bin/sh
# Install the Debian packages refit needs to build and test, when missing.
# Idempotent and quiet when everything is there.  Needs root (or sudo) only
# when something is missing.  REFIT_NO_DEPS=1 skips it (offline builds).
# Extra package names as arguments are installed too (make testbed).
set -eu
[ "${REFIT_NO_DEPS:-0}" = 1 ] && exit 0
pkgs="gcc make pkg-config check libsubunit-dev libcjson-dev clang libclang-rt-14-dev
      libgrpc-dev libprotobuf-c-dev protobuf-c-compiler libuv1-dev libssl-dev
      python3 python3-venv python3-grpcio python3-grpc-tools python3-numpy openssl python3-cryptography
      python3-torch python3-setuptools python3-pip libmicrohttpd-dev prometheus
      python3-prometheus-client iproute2 nftables etcd-server etcd-client $*"
missing=""
for p in $pkgs; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
		missing="$missing $p"
	fi
done
[ -z "$missing" ] && exit 0
echo "deps: installing:$missing"
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
echo "deps: done"
