# jobq: `make run` starts the demo, `make test` runs every test.
GO        ?= go
BIN       := bin
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT    ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo none)
LDFLAGS   := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)
NATS_CLI  := github.com/nats-io/natscli/nats@v0.5.0
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
PREFIX    ?= /usr/local

.DEFAULT_GOAL := help

.PHONY: help
help: ## show the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## build bin/jobq
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/jobq .

.PHONY: run
run: build ## build and run jobq serve --demo on ./jobq-data
	./$(BIN)/jobq serve --demo

$(BIN)/nats:
	GOBIN=$(CURDIR)/$(BIN) $(GO) install $(NATS_CLI)

.PHONY: test
test: $(BIN)/nats ## run every test with -race (builds the nats CLI for the compatibility tests)
	JOBQ_NATS_CLI=$(CURDIR)/$(BIN)/nats $(GO) test -race -shuffle=on -count=1 -timeout 20m ./...

.PHONY: soak
soak: ## the crash test, long: many jobs, many SIGKILLs; then leader changes on a cluster
	JOBQ_SOAK=1 $(GO) test -run 'TestCrash' -count=1 -timeout 60m -v .
	JOBQ_SOAK=1 $(GO) test -run 'StepDown|LeaderChange' -count=1 -timeout 10m -v ./queue/

.PHONY: fuzz
fuzz: ## run each fuzz target for a while
	$(GO) test -run '^$$' -fuzz FuzzKey -fuzztime 30s ./data/
	$(GO) test -run '^$$' -fuzz FuzzParseSpec -fuzztime 30s ./handlers/
	$(GO) test -run '^$$' -fuzz FuzzParseRoute -fuzztime 30s ./handlers/
	$(GO) test -run '^$$' -fuzz FuzzParseImportLine -fuzztime 30s ./queue/
	$(GO) test -run '^$$' -fuzz FuzzParseAckSubjectAgreesWithNatsGo -fuzztime 30s ./queue/

.PHONY: bench
bench: build ## jobq bench: jobq with and without its ledger against a raw JetStream baseline
	./$(BIN)/jobq bench

.PHONY: gobench
gobench: ## Go benchmarks of the ledger, router, record encoding and pipeline, with allocations and CPU per job
	$(GO) test -run '^$$' -bench . -benchmem ./data/ ./handlers/ ./queue/

.PHONY: footprint
footprint: build ## binary size, idle RSS, start-up time empty and with 1M pending jobs (PENDING=n)
	./.ci/footprint.sh

.PHONY: lint
lint: ## gofmt, go vet, staticcheck
	@test -z "$$(gofmt -l .)" || (gofmt -l .; exit 1)
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

.PHONY: tidy
tidy: ## go mod tidy
	$(GO) mod tidy

.PHONY: install
install: build ## install bin/jobq to $(PREFIX)/bin
	install -D -m 0755 $(BIN)/jobq $(DESTDIR)$(PREFIX)/bin/jobq

PLATFORMS := linux/amd64 linux/arm64 linux/arm

.PHONY: release
release: ## cross-build static binaries for linux amd64, arm64 and arm into dist/ and print their sizes
	@mkdir -p dist
	@for p in $(PLATFORMS); do \
		os=$${p%/*}; arch=$${p#*/}; out=dist/jobq-$$os-$$arch; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $$out . || exit 1; \
	done
	@ls -l dist | awk 'NR > 1 {printf "%-22s %6.1f MB\n", $$9, $$5 / 1048576}'

.PHONY: clean
clean: ## remove build output
	rm -rf $(BIN) dist
