#!/usr/bin/env bash
# Installs what corral needs on a fresh Debian 12 machine (as root): the
# Debian packages it uses at run time and in tests, Go modules, staticcheck.
set -euo pipefail
cd "$(dirname "$0")/.."
# qemu-system-x86 runs the microvm backend's guests, e2fsprogs formats
# their writable disks.
pkgs=(busybox-static mmdebstrap erofs-utils runc xfsprogs iproute2 ca-certificates protobuf-compiler python3
  e2fsprogs qemu-system-x86)
# gcc and libc6-dev build the static C corral-initstub (PID 1 of idle container
# sandboxes).
pkgs+=(gcc libc6-dev)
# chromium (headless) loads the dashboard in its test.
pkgs+=(chromium)
# The vm backend: qemu-img makes sandbox overlays, seabios and ovmf boot
# bios and uefi images; mmdebstrap (above) builds the Debian VM image.
pkgs+=(qemu-utils seabios ovmf)
# The firmware boot tests build disks with their own boot loader
# (internal/backend/vm/vmtest): partition tables, FAT, syslinux, systemd-boot.
pkgs+=(fdisk dosfstools mtools syslinux syslinux-common systemd-boot-efi)
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
# SeaweedFS: the real S3 server the blob store's S3 tests run against. Its
# go.mod has replace directives, so `go install pkg@version` refuses it: build
# the module as the main module from a copy of the module cache. Skipped when
# the installed weed already reports this version.
weed_version=v0.0.0-20261109003541-7506e5f91cd6
if [ "$(cat "$GOBIN/.weed-version" 2>/dev/null)" != "$weed_version" ] || [ ! -x "$GOBIN/weed" ]; then
  echo "deps: building weed (SeaweedFS $weed_version; takes several minutes)"
  weed_mod=$(GOFLAGS=-mod=mod go mod download -json "github.com/seaweedfs/seaweedfs@$weed_version" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
  weed_src=$(mktemp -d)
  cp -r "$weed_mod/." "$weed_src"
  chmod -R u+w "$weed_src"
  (cd "$weed_src" && GOFLAGS=-mod=mod go build -trimpath -o "$GOBIN/weed" ./weed)
  rm -rf "$weed_src"
  echo "$weed_version" >"$GOBIN/.weed-version"
fi
