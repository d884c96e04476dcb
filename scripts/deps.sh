#!/usr/bin/env bash
# Installs what corral needs on a fresh Debian 12 machine (as root): the
# Debian packages it uses at run time and in tests, Go modules, staticcheck.
set -euo pipefail
cd "$(dirname "$0")/.."
# qemu-system-x86 runs the microvm backend's guests, e2fsprogs formats
# their writable disks.
pkgs=(busybox-static mmdebstrap erofs-utils runc xfsprogs iproute2 ca-certificates protobuf-compiler python3
  e2fsprogs qemu-system-x86)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "deps: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The microvm guest kernel and its modules, without recommends (firmware,
# a bootloader): corral builds the guest's initramfs itself.
if ! dpkg-query -W -f='${Status}' linux-image-amd64 2>/dev/null | grep -q "install ok installed"; then
  echo "deps: installing linux-image-amd64 (microvm guest kernel)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends linux-image-amd64 >/dev/null
fi
go mod download
export GOBIN="${GOBIN:-$(go env GOPATH)/bin}"
if ! command -v staticcheck >/dev/null && [ ! -x "$GOBIN/staticcheck" ]; then
  go install honnef.co/go/tools/cmd/staticcheck@v0.8.2
fi
