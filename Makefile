# corral build entry points. `make build` produces bin/corral, the static
# bin/corral-init that builds every container sandbox, the static C
# bin/corral-initstub that is PID 1 of an idle one, and the
# static bin/corral-probe (red-team attempts, the load of `corral bench net`).
GO ?= go
CC = gcc

.PHONY: build generate test lint clean redteam ui

build:
	$(GO) build -o bin/corral ./cmd/corral
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o bin/corral-init ./cmd/corral-init
	$(CC) -static -Os -s -Wall -Wl,-e,stub_entry -o bin/corral-initstub internal/guest/init/stub/stub.c
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o bin/corral-probe ./cmd/corral-probe
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o bin/corral-agent ./cmd/corral-agent

# Regenerate protobuf/ConnectRPC code (committed); needs protoc.
generate:
	./scripts/generate.sh
	./scripts/generate-e2b.sh

# Rebuild the dashboard bundle (committed in internal/ui/dist, embedded in
# the binary) from internal/ui/web with esbuild; needs npm.
ui:
	cd internal/ui/web && npm ci --no-audit --no-fund && npm run build

test:
	./scripts/test.sh

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GO) vet ./...
	staticcheck ./...

clean:
	rm -rf bin

# The red-team suite (docs/THREATS.md): runs the probe in sandboxes of every
# available backend, checks the host side and noisy neighbours, and prints
# the table attempt × backend → blocked / expected / GAP / FAILED. As root.
redteam:
	CORRAL_REDTEAM=1 $(GO) test -count=1 -timeout 40m -v ./internal/redteam
