#!/bin/sh
# Installs what edgebox's tests and code generation need. Idempotent: it
# installs only what is missing. Needs root for apt (or sudo).
set -eu

GO_PROTOC_GEN_GO=google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
GO_PROTOC_GEN_GO_GRPC=google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
# systemd for systemd-analyze (no daemon starts), lintian and rpm to check
# the packages, curl and util-linux (unshare) for the install script test.
# containerd, runc and busybox-static for the containerd driver's tests
# (they start their own daemon).
APT_PACKAGES="protobuf-compiler libprotobuf-dev systemd lintian rpm curl util-linux ca-certificates containerd runc busybox-static"

missing=""
for p in $APT_PACKAGES; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
	echo "test-deps: installing$missing"
	SUDO=""
	[ "$(id -u)" -eq 0 ] || SUDO=sudo
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

GOBIN=$(go env GOPATH)/bin
[ -x "$GOBIN/protoc-gen-go" ] && "$GOBIN/protoc-gen-go" --version 2>/dev/null | grep -q v1.36.12 || go install "$GO_PROTOC_GEN_GO"
[ -x "$GOBIN/protoc-gen-go-grpc" ] && "$GOBIN/protoc-gen-go-grpc" --version 2>/dev/null | grep -q 1.6.2 || go install "$GO_PROTOC_GEN_GO_GRPC"
echo "test-deps: ready"
