#!/usr/bin/env bash
# Installs what corral needs on a fresh Debian 12 machine (as root): the
# Debian packages it uses at run time and in tests, Go modules, staticcheck.
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(busybox-static mmdebstrap erofs-utils runc xfsprogs iproute2 ca-certificates protobuf-compiler python3)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "deps: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
go mod download
export GOBIN="${GOBIN:-$(go env GOPATH)/bin}"
if ! command -v staticcheck >/dev/null && [ ! -x "$GOBIN/staticcheck" ]; then
  go install honnef.co/go/tools/cmd/staticcheck@v0.8.2
fi
