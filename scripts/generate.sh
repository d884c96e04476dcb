#!/usr/bin/env bash
# Regenerates the committed protobuf/ConnectRPC code under api/.
# Needs protoc (apt protobuf-compiler); the Go plugins are pinned here.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOBIN="${GOBIN:-$(go env GOPATH)/bin}"
go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1
PATH="$GOBIN:$PATH" protoc -I api \
  --go_out=api --go_opt=paths=source_relative \
  --connect-go_out=api --connect-go_opt=paths=source_relative \
  api/corral/v1/*.proto
