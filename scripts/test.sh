#!/usr/bin/env bash
# The test command: installs dependencies, builds, checks formatting, vet and
# staticcheck, then runs every test as root against the real kernel.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "test.sh: run as root (tests create namespaces, mounts and cgroups)" >&2
  exit 1
fi
./scripts/deps.sh
export PATH="$(go env GOPATH)/bin:$PATH"
make build
unformatted=$(gofmt -l $(git ls-files '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change: $unformatted" >&2
  exit 1
fi
go vet ./...
staticcheck ./...
# -p 1: the packages share the machine's cgroups, loop devices and 2 cores.
go test -p 1 -count=1 -timeout 30m ./...
# The red-team suite with its table (docs/THREATS.md).
make redteam
# The Python SDK against a live daemon of its own.
./scripts/test-python.sh
