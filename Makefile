# tclone build, test and demo entry points. Everything that needs root
# installs what it needs first (hack/setup-host.sh), so `make test` and
# `make demo` work on a fresh machine.

GO ?= go
PREFIX ?= /usr/local
BIN := bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# Build tags the Podman v5 bindings need when built without cgo storage drivers.
PODMAN_TAGS := remote exclude_graphdriver_btrfs exclude_graphdriver_devicemapper containers_image_openpgp
LDFLAGS := -X github.com/tclone/tclone/runtime/buildinfo.Version=$(VERSION)
GOFLAGS_BUILD := -trimpath -tags "$(PODMAN_TAGS)" -ldflags "$(LDFLAGS)"
export PODMAN_IGNORE_CGROUPSV1_WARNING := 1

.PHONY: all build install setup test unit-test integration-test demo bench lint clean kernel-test

all: build

build:
	@mkdir -p $(BIN)
	$(GO) build $(GOFLAGS_BUILD) -o $(BIN)/tclone ./shim

install: build
	hack/install.sh $(BIN)/tclone

# Host set-up: packages, cgroups, sysctls, images, tclone itself.
setup: build
	hack/setup-host.sh

unit-test:
	$(GO) test -count=1 -tags "$(PODMAN_TAGS)" $$($(GO) list ./... | grep -v /test/)

include kernel/kernel.mk

clean:
	rm -rf $(BIN)
