#!/usr/bin/env bash
# Regenerates the committed Go code of E2B's envd protocol (internal/e2b/envdpb),
# from our copies of E2B's spec/envd .proto files. Same pinned plugins as
# generate.sh; needs protoc (apt protobuf-compiler).
set -euo pipefail
cd "$(dirname "$0")/.."
export GOBIN="${GOBIN:-$(go env GOPATH)/bin}"
go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1
PATH="$GOBIN:$PATH" protoc -I internal/e2b/envdpb \
  --go_out=internal/e2b/envdpb --go_opt=paths=source_relative \
  --connect-go_out=internal/e2b/envdpb --connect-go_opt=paths=source_relative \
  internal/e2b/envdpb/process/process.proto internal/e2b/envdpb/filesystem/filesystem.proto
