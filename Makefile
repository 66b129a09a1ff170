# edgebox: `make help` lists the targets.

GO       ?= go
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X github.com/edgebox/edgebox/console.Version=$(VERSION) -X main.version=$(VERSION)
BINARIES := edgebox-console edgebox-agent edgebox
GOBIN    := $(shell $(GO) env GOPATH)/bin

.PHONY: all build dist test check proto web demo bench fuzz soak help clean

all: build ## build the three binaries into bin/ (the default)

build: ## build edgebox-console, edgebox-agent and edgebox into bin/
	@mkdir -p bin
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/ ./cmd/...

dist: ## agents and consoles for linux/amd64, linux/arm64 (and the Windows agent), .deb, .rpm, .zip and SHA256SUMS in dist/
	$(GO) run ./installer/dist -out dist -version $(VERSION) -ldflags '$(LDFLAGS)'

test: ## install test dependencies, then run every test with -race
	sh scripts/test-deps.sh
	EDGEBOX_TEST_STRICT=1 $(GO) test -race -count=1 -timeout 20m $$($(GO) list ./... | grep -Ev '/internal/test/(integration|storm|rolloutsim)$$')
	@# Alone, after the rest: their lock-out, reconnect and storm tests hold
	@# the console to deadlines (boxes back in 10 s, API p99 under 1 s, a
	@# storm's fleet back in 3 min), which measure the console, not another
	@# package's tests on the same two cores.
	EDGEBOX_TEST_STRICT=1 $(GO) test -race -count=1 -timeout 20m -p 1 ./internal/test/integration/ ./internal/test/storm/
	@# The rollout simulator's 1,000 agents take six minutes under the race
	@# detector for no more finding: the same code runs under it above.
	EDGEBOX_TEST_STRICT=1 $(GO) test -count=1 -timeout 10m ./internal/test/rolloutsim/
	EDGEBOX_TEST_STRICT=1 $(GO) test -race -count=1 -tags gousb ./usbhub/

check: ## gofmt, vet, generated code in sync, go mod tidy, dependency rules, cross-builds
	@echo "check: gofmt"; test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	@echo "check: vet"; $(GO) vet ./... && $(GO) vet -tags gousb ./usbhub/ ./cmd/edgebox-agent/
	@echo "check: generated code"; $(MAKE) -s proto && git diff --exit-code -- proto/
	@echo "check: go mod tidy"; $(GO) mod tidy && git diff --exit-code -- go.mod go.sum
	@echo "check: web bundle"; $(MAKE) -s web >/dev/null && git diff --exit-code -- console/webui/dist && \
		test -z "$$(git status --porcelain -- console/webui/dist)" || { echo "the committed web bundle differs from a fresh build: run make web and commit it"; exit 1; }
	@echo "check: dependency rules"; $(GO) test -count=1 -run 'TestDependencyRules|TestDirectImportRules|TestConsoleLayers' .
	@for p in windows/amd64 windows/arm64 linux/arm64; do \
		echo "check: build $$p"; GOOS=$${p%/*} GOARCH=$${p#*/} $(GO) build -o /dev/null ./cmd/... || exit 1; \
	done

web: ## rebuild the web console (web/, with the versions of web/package-lock.json) into console/webui/dist, which is committed
	cd web && npm ci --no-audit --no-fund && npm run build

proto: ## regenerate proto/ Go code with protoc, protoc-gen-go and protoc-gen-go-grpc
	@sh scripts/test-deps.sh >/dev/null
	cd proto && PATH="$(GOBIN):$$PATH" $(GO) generate ./...

demo: build ## start a console on fresh data with a local enrolled agent; Ctrl-C stops both
	sh scripts/demo.sh

bench: ## run the benchmarks, a few minutes (figures go in docs/benchmarks.md)
	$(GO) test -run '^$$' -bench Throughput -benchtime 4x -count 3 ./tunnel/
	$(GO) test -run '^$$' -bench Link -benchtime 2x -timeout 20m ./tunnel/
	$(GO) test -run '^$$' -bench Fleet -benchtime 1x -timeout 20m ./internal/test/bench/
	$(GO) test -run '^$$' -bench SessionCost -benchtime 1x -timeout 20m ./tunnel/
	$(GO) test -run '^$$' -bench Sync -benchtime 1x -timeout 20m ./internal/test/bench/
	$(GO) test -run '^$$' -bench BoltCommit -benchtime 1x -count 3 ./console/store/
	$(GO) test -run '^$$' -bench 'Pull|Deploy' -benchtime 1x -timeout 20m ./internal/test/bench/
	$(GO) test -run '^$$' -bench 'BenchmarkRollout$$|AgentSwap' -benchtime 1x -timeout 20m ./internal/test/bench/
	$(GO) test -run '^$$' -bench NationalPush -benchtime 1x -timeout 20m ./console/rollout/
	$(GO) test -run '^$$' -bench 'KeystrokeEcho|Shells|BenchmarkForward$$' -benchtime 1x -timeout 20m ./internal/test/bench/
	$(GO) test -run '^$$' -bench 'UKEY' -benchtime 1x -timeout 20m ./internal/test/bench/
	$(GO) test -run '^$$' -bench Votes -benchtime 20000x ./console/sitehealth/
	$(GO) test -run '^$$' -bench ProbeBandwidth -benchtime 20x ./agent/sitepeer/
	$(GO) test -run '^$$' -bench SiteVerdicts -benchtime 1x -timeout 20m ./internal/test/integration/
	$(GO) test -run '^$$' -bench Evaluate -benchtime 3x ./console/alerts/

fuzz: ## run each fuzz target for 30 s
	$(GO) test -run '^$$' -fuzz FuzzReadHeader -fuzztime 30s ./tunnel/
	$(GO) test -run '^$$' -fuzz FuzzReadVerdict -fuzztime 30s ./tunnel/
	$(GO) test -run '^$$' -fuzz FuzzReadEarlyBusy -fuzztime 30s ./tunnel/
	$(GO) test -run '^$$' -fuzz FuzzParseToken -fuzztime 30s ./enroll/
	$(GO) test -run '^$$' -fuzz FuzzDecodeRequest -fuzztime 30s ./enroll/
	$(GO) test -run '^$$' -fuzz FuzzAPIBodies -fuzztime 30s ./console/httpapi/
	$(GO) test -run '^$$' -fuzz FuzzParseHash -fuzztime 30s ./console/auth/
	$(GO) test -run '^$$' -fuzz FuzzSyncUp -fuzztime 30s ./console/boxsync/
	$(GO) test -run '^$$' -fuzz FuzzServeBallots -fuzztime 30s ./console/
	$(GO) test -run '^$$' -fuzz FuzzSyncDown -fuzztime 30s ./agent/
	$(GO) test -run '^$$' -fuzz FuzzParseTarget -fuzztime 30s ./images/registry/
	$(GO) test -run '^$$' -fuzz FuzzParseRoute -fuzztime 30s ./images/registry/
	$(GO) test -run '^$$' -fuzz FuzzParseReferrer -fuzztime 30s ./images/registry/
	$(GO) test -run '^$$' -fuzz FuzzFetch -fuzztime 30s ./images/vm/
	$(GO) test -run '^$$' -fuzz FuzzParseUevent -fuzztime 30s ./usbhub/
	$(GO) test -run '^$$' -fuzz FuzzDecodeInputFrame -fuzztime 30s ./sessionwire/
	$(GO) test -run '^$$' -fuzz FuzzReadReply -fuzztime 30s ./tunnel/forwarding/
	$(GO) test -run '^$$' -fuzz FuzzViewOnly -fuzztime 30s ./console/sessions/
	$(GO) test -run '^$$' -fuzz FuzzVerifyRecording -fuzztime 30s ./console/recording/
	$(GO) test -run '^$$' -fuzz FuzzServeConn -fuzztime 30s ./usbhub/usbip/
	$(GO) test -run '^$$' -fuzz FuzzClient -fuzztime 30s ./usbhub/usbip/
	$(GO) test -run '^$$' -fuzz FuzzResumeServer -fuzztime 30s ./usbhub/usbip/
	$(GO) test -run '^$$' -fuzz FuzzResumeClient -fuzztime 30s ./usbhub/usbip/
	$(GO) test -run '^$$' -fuzz FuzzVHCIStatus -fuzztime 30s ./usbhub/usbip/
	$(GO) test -run '^$$' -fuzz FuzzCommand -fuzztime 30s ./usbhub/ccid/
	$(GO) test -run '^$$' -fuzz FuzzServe -fuzztime 30s ./usbhub/usbredir/
	$(GO) test -run '^$$' -fuzz FuzzParseConfig -fuzztime 30s ./usbhub/usbdev/
	$(GO) test -run '^$$' -fuzz FuzzOpen -fuzztime 30s ./sitevote/
	$(GO) test -run '^$$' -fuzz FuzzParseHeartbeat -fuzztime 30s ./agent/sitepeer/
	$(GO) test -run '^$$' -fuzz FuzzParseStreamRequest -fuzztime 30s ./console/replicas/
	$(GO) test -run '^$$' -fuzz FuzzAnswerError -fuzztime 30s ./console/replicas/

soak: ## 500 randomized sync histories with faults (make test runs 50), and 20 on three replicas (make test runs 4), about 10 minutes
	$(GO) test -race -count=1 -timeout 60m -run TestSyncHistory ./internal/test/integration/ -history-runs=500 -ha-history-runs=20

clean: ## remove build output
	rm -rf bin dist .demo

help: ## list the targets
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-8s %s\n", $$1, $$2}'
