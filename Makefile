# tclone: build, test, demo and benchmark entry points.
#
# `make test` and `make demo` work on a fresh machine as root: they build,
# then run hack/setup-host.sh, which installs and configures what they need
# (a second run of it is quick and changes nothing).

GO ?= go
PREFIX ?= /usr/local
BIN := bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# Build tags the Podman v5 bindings need to build without cgo storage drivers.
PODMAN_TAGS := remote exclude_graphdriver_btrfs exclude_graphdriver_devicemapper containers_image_openpgp
LDFLAGS := -X github.com/tclone/tclone/runtime/buildinfo.Version=$(VERSION)
GOBUILD := $(GO) build -trimpath -tags "$(PODMAN_TAGS)" -ldflags "$(LDFLAGS)"
GOTEST := $(GO) test -tags "$(PODMAN_TAGS)"
STATICCHECK_VERSION := v0.8.2
# The benchmark harness is a module of its own (test/bench/go.mod), so that its
# plotting dependencies stay out of tclone's go.mod; `./...` at the top does
# not reach it, so every target that covers it runs the go command there.
BENCHGO := $(GO) -C test/bench
export PODMAN_IGNORE_CGROUPSV1_WARNING := 1
# A test that cannot run here fails instead of skipping (test/testenv), in
# every target: a green run means the paths ran. Tests only the kernel VM can
# run (a loaded module) skip on the host naming the VM stage that runs them.
# TCLONE_REQUIRE=0 lets tests skip, e.g. a run without root.
TCLONE_REQUIRE ?= 1
export TCLONE_REQUIRE

.PHONY: all build install setup test unit-test fuzz-test integration-test demo ci-example bench bench-quick lint clean

all: build

build:
	@mkdir -p $(BIN)
	$(GOBUILD) -o $(BIN)/tclone ./shim/cmd/tclone
	$(GOBUILD) -o $(BIN)/tclone-service ./shim/cmd/tclone-service
	$(GOBUILD) -o $(BIN)/podman-fork ./shim/cmd/podman-fork
	ln -sfn podman-fork $(BIN)/podman-branch
	# The fidelity workload runs inside test containers: static, no libc.
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/workload ./test/workload
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/memfill ./test/cmd/memfill
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/oldcriu ./test/cmd/oldcriu

install: build
	hack/install.sh $(BIN) $(PREFIX)

# Host set-up: packages, cgroups, sysctls, test images, tclone itself.
setup: build
	hack/setup-host.sh

# Everything: unit tests, then the real-stack integration and fidelity
# suites (root, Podman, crun, CRIU), the kernel module's VM suite and the
# benchmark harness smoke test. Nothing here skips: a missing piece fails.
#
# Each stage runs within a limit of its own (hack/stage.sh), in minutes,
# and a stage past it fails the run naming the stage, long before CI's 90
# minutes would cut it without saying where the time went. The limits sum
# to 74; on a fresh machine the stages took about setup 9 (with a cold Go
# build), unit-test 2, fuzz-test 1, integration-test 14 to 20, kernel-test
# 10 to 13 (TCG) and bench-quick 3.5 minutes (README.md).
STAGE := hack/stage.sh
STAGE_LIMITS := setup=12 unit-test=5 fuzz-test=2 integration-test=30 kernel-test=19 bench-quick=6
test:
	@echo "make test: stages and their limits in minutes: $(STAGE_LIMITS)"
	@set -e; for stage in setup unit-test fuzz-test integration-test kernel-test bench-quick; do \
		limit=$$(echo "$(STAGE_LIMITS)" | tr ' ' '\n' | sed -n "s/^$$stage=//p"); \
		$(STAGE) $$stage $$limit $(MAKE) --no-print-directory $$stage; \
	done

# One package at a time: the lazy-pages tests run real CRIU restores of
# 1 GiB, which fail when they share this machine's two CPUs with other
# packages' tests (a CRIU lazy restore once hung there until killed).
# The VM harness's own rules are checked on saved guest logs (no VM).
unit-test:
	$(GOTEST) -count=1 -p 1 $$($(GO) list ./... | grep -v -e /test/integration -e /kernel/vmtest)
	kernel/vmtest/bootagain-test.sh
	kernel/vmtest/selection-test.sh
	hack/stage-test.sh
	hack/build-criu-test.sh
	$(BENCHGO) test -count=1 ./...

# Go's native fuzzing of the branch archive reader and the manifest checks,
# for a bounded time (35 s); a crasher is kept in runtime/branch/testdata/fuzz
# and fails unit-test from then on.
fuzz-test:
	$(GOTEST) -count=1 -run '^$$' -fuzz '^FuzzImport$$' -fuzztime 25s ./runtime/branch
	$(GOTEST) -count=1 -run '^$$' -fuzz '^FuzzManifest$$' -fuzztime 10s ./runtime/branch

# The REST tests need the Podman API service, and the Kubernetes tests
# containerd (tclone as a runtime class) and a local registry; what this
# target starts, it also stops. A failed run ends with each failed test and
# what it logged (hack/test-recap.sh): the reasons, at the end of a long
# output.
integration-test: setup
	@if hack/podman-service.sh status >/dev/null 2>&1; then started=0; else started=1; hack/podman-service.sh start; fi; \
	log=$$(mktemp -t tclone-integration.XXXXXX); \
	stop() { rm -f "$$log" "$$log.status"; hack/containerd.sh stop; hack/registry.sh stop; if [ $$started = 1 ]; then hack/podman-service.sh stop; fi; }; \
	trap stop EXIT; trap 'exit 143' TERM; trap 'exit 130' INT; \
	hack/registry.sh start && TCLONE_BINDIR=$(CURDIR)/$(BIN) hack/containerd.sh start && \
	{ TCLONE_BINDIR=$(CURDIR)/$(BIN) \
		$(GOTEST) -count=1 -timeout 40m -v ./test/integration/...; echo $$? >"$$log.status"; } 2>&1 | tee "$$log"; \
	status=$$(cat "$$log.status" 2>/dev/null); [ -n "$$status" ] || status=1; \
	if [ "$$status" != 0 ]; then hack/test-recap.sh "$$log"; fi; \
	exit $$status

demo: setup
	hack/demo.sh

# A CI pipeline that forks a PostgreSQL test database into 4 shards over
# tclone's REST endpoint instead of loading its fixture 4 times.
ci-example: setup
	hack/ci-example.sh

# The full benchmark (about 40 minutes): BENCHMARKS.md, bench-results/. Its
# forks through the CRI need containerd and the local registry, which
# hack/with-kube.sh starts (and stops) around it.
bench: setup
	TCLONE_BINDIR=$(CURDIR)/$(BIN) hack/with-kube.sh $(BENCHGO) run . --out $(CURDIR)/bench-results --markdown $(CURDIR)/BENCHMARKS.md

# The harness on tiny workloads, one repetition: checks it still produces
# well-formed results (never a timing). Its output is removed afterwards.
bench-quick: setup
	@out=$$(mktemp -d -t tclone-bench-quick.XXXXXX) && \
		TCLONE_BINDIR=$(CURDIR)/$(BIN) hack/with-kube.sh $(BENCHGO) run . --quick --out $$out; status=$$?; rm -rf $$out; exit $$status

# test/bench builds against this checkout: when a package of tclone's that it
# imports gains a dependency, its go.mod needs `go mod tidy` too.
lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
		if [ -n "$$unformatted" ]; then echo "gofmt would change: $$unformatted"; exit 1; fi
	$(GO) vet -tags "$(PODMAN_TAGS)" ./...
	$(BENCHGO) mod tidy -diff
	$(BENCHGO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) -tags "$(PODMAN_TAGS)" ./...
	$(BENCHGO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

clean:
	rm -rf $(BIN)

include kernel/kernel.mk
