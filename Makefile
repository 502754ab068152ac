# xdpq. Everything that touches the kernel needs root.
GO          ?= go
STATICCHECK ?= $(shell $(GO) env GOPATH)/bin/staticcheck
ERRCHECK    ?= $(shell $(GO) env GOPATH)/bin/errcheck

.PHONY: all build image version manifests packages test-builds test e2e-binaries e2e-node-binaries e2e-tests e2e bench bench-e2e generate lint demo tools cclient

all: build

# Every command into bin/ (bin/deviceplugin, bin/xdpqctl, ...), the CNI
# plugin as bin/cni/xdpq: a CNI runtime runs a plugin by its name in its
# bin directory. (An older `go build -o bin/ ./cmd/...` left a file
# bin/cni where that directory goes: it is removed.)
CMDS := $(filter-out cni,$(notdir $(wildcard cmd/*)))
build:
	$(GO) build ./...
	@if [ -f bin/cni ]; then rm bin/cni; fi
	$(GO) build -o bin/ $(addprefix ./cmd/,$(CMDS))
	$(GO) build -o bin/cni/xdpq ./cmd/cni

# The image of the Dockerfile, built without Docker (cmd/xdpqimage): one
# docker-archive per architecture, bin/xdpq-image-<arch>.tar, tagged
# xdpq.io/xdpq:$(VERSION), the release (the file VERSION, which is the
# chart's appVersion: helm install takes the image make image built), for
# `ctr -n k8s.io images import` or `docker load`.
VERSION      ?= $(shell cat VERSION)
REVISION     ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
CREATED      ?= $(shell git log -1 --format=%cI 2>/dev/null)
IMAGE_ARCHES ?= amd64 arm64
image:
	@for a in $(IMAGE_ARCHES); do \
	  echo "$(GO) run ./cmd/xdpqimage -arch $$a -version $(VERSION) -o bin/xdpq-image-$$a.tar"; \
	  $(STATIC) $(GO) run ./cmd/xdpqimage -arch $$a -version $(VERSION) -revision $(REVISION) -created "$(CREATED)" -o bin/xdpq-image-$$a.tar || exit 1; \
	done

# A new release: `make version V=0.2.0` writes it to VERSION and to the
# chart's version and appVersion, and renders manifests/xdpq.yaml again
# (test/chart fails when they differ). Add its section to CHANGELOG.md.
version:
	@test -n "$(V)" || { echo "make version V=x.y.z"; exit 2; }
	echo $(V) > VERSION
	sed -i -e 's/^version: .*/version: $(V)/' -e 's/^appVersion: .*/appVersion: "$(V)"/' charts/xdpq/Chart.yaml
	$(MAKE) --no-print-directory manifests

# manifests/xdpq.yaml: the Helm chart charts/xdpq rendered with its
# default values (helm template, by Helm's SDK in test/chart); a test of
# test/chart fails when it is stale.
manifests:
	cd test/chart && $(GO) run ./cmd/manifests -o ../../manifests/xdpq.yaml

# The Debian packages the tests need, one list (.ci/packages) that .ci/run
# installs from too: as root the missing ones are installed; as another
# user they are named, and the tests that need them skip (under CI=true
# they fail).
packages:
	@if [ "$$(id -u)" = 0 ]; then .ci/packages; \
	else .ci/packages --check || echo "make: going on without them: the tests that need them skip"; fi

# The builds tests use, in a step of their own before the tests, showing
# what they build: xdpq's image for both architectures (make image; on an
# empty build cache the arm64 cross-compile alone takes minutes), which
# internal/tools/image then builds again from the cache and compares with the
# Dockerfile. A test's timeout then measures the test.
test-builds: packages
	@echo "make test: building the image for $(IMAGE_ARCHES) first (make image)"
	@$(MAKE) --no-print-directory image

# One build of each package for every use of it: what needs neither the
# race detector nor cgo (lint, the image, the e2e module and its cluster's
# binaries, test/chart) is built static and -trimpath, as the image's and
# the cluster's binaries must be, so a package compiled for one is in the
# build cache for the others. (The main module's tests keep cgo, which
# -race needs.)
STATIC := CGO_ENABLED=0 GOFLAGS="-trimpath $(GOFLAGS)"

# The test command of the README; CI runs it as root with CI=true. Its
# first line installs the packages the tests need and builds what they
# build (test-builds); the next runs every package's tests, with the race
# detector; then xdpq's device plugins against kubelet's own device
# manager (test/e2e/devicemanager, in the e2e module, whose kubelet it
# shares: its first build takes minutes); the last lints and renders the
# Helm chart (test/chart).
test: test-builds
	$(GO) test -count=1 -race ./...
	cd test/e2e && $(STATIC) $(GO) test -count=1 ./devicemanager
	cd test/chart && $(STATIC) $(GO) test -count=1 ./...

# The end-to-end tests (test/e2e, a module of its own) on a real
# single-node cluster: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler and a kubelet v1.37.2 with containerd. Needs root,
# containerd, runc and containernetworking-plugins. The cluster's binaries
# are built once into /var/cache/xdpq-e2e ($$XDPQ_E2E_CACHE) by
# e2e-binaries first, showing its progress (go test would hold it back
# until the end).
# One package at a time (-p 1): a machine runs one e2e node, and a
# package that wants one waits for the other's to stop.
# (make test runs test/e2e/devicemanager.)
e2e: e2e-binaries
	@$(MAKE) --no-print-directory e2e-tests

# The e2e tests alone, the binaries built (a test builds one missing, or
# waits for another process's build of it).
e2e-tests:
	cd test/e2e && $(STATIC) $(GO) test -p 1 -count=1 -timeout 40m $$($(GO) list ./... | grep -v /devicemanager$$)

# The cluster's binaries alone (into $$XDPQ_E2E_CACHE); .ci/run builds them
# in the background while the other checks run: first the node's
# (kubebin -node: every e2e test needs them; e2e-node-binaries), then
# kubesd (Prometheus's Kubernetes discovery), which only one scenario's
# last steps need.
e2e-binaries:
	cd test/e2e && $(STATIC) $(GO) run ./cmd/kubebin >/dev/null
e2e-node-binaries:
	cd test/e2e && $(STATIC) $(GO) run ./cmd/kubebin -node >/dev/null

# Receive rates side by side on one veth pair (a table: XDP_DROP, pkg/xsk,
# DPDK, and pods through the daemon's broker, xdpqperf and the C client's
# xdpq-rxdrop, both built from this tree), then forwarding, transmit and
# latency tables (XDP_TX, DPDK's macswap and txonly, xdpqperf l2fwd and
# txpush, the C client's xdpq-l2fwd), the time the
# agent takes to re-attach after a foreign program goes (100 trials),
# status and a socket's add and remove on one netdev while another's
# attach takes 300 ms (the agent's kernel work is outside its lock), the
# daemon (its own process) on 64 netdevs of 64 queues: a table of first
# ListAndWatch, Allocate, status and the allocations' list idle and under
# parallel CNI ADDs (paced, flat out, and through the plugin's binary),
# ADD/DEL, its CPU time and RSS against the goals, 3 rounds in two CPU
# layouts (XDPQ_SCALE_BASELINE=<a deviceplugin binary of another tree>
# runs it beside this tree's; for profiles: -bench Scale64x64InProcess
# -cpuprofile cpu.out), DRA's Prepare beside the device plugin's Allocate
# on the same 64x64 daemon (300 claims of two queues, p50/p99), and
# probing 16 queues for sockets one by one and at once, and CNI ADD/DEL
# latency through cnitool (100 attachments, p50/p99).
bench:
	$(GO) run ./cmd/xdpqbench
	$(GO) run ./cmd/xdpqbench -size 1514 -pod-queues 1,4 -tx=false -latency=false
	$(GO) run ./cmd/xdpqbench -size 9014 -pod-queues 1
	$(GO) test -run '^$$' -bench Reattach -benchtime 100x ./pkg/agent
	$(GO) test -run '^$$' -bench SlowAttach -benchtime 200x ./pkg/agent
	$(GO) test -run '^$$' -bench 'Scale64x64$$' -benchtime 1x -timeout 60m ./pkg/daemon
	$(GO) test -run '^$$' -bench 'Prepare64x64$$' -benchtime 300x ./pkg/daemon
	$(GO) test -run '^$$' -bench BusyQueues -benchtime 10x ./pkg/xsk
	$(GO) test -run '^$$' -bench CNIToolAddDel -benchtime 100x ./pkg/cni
	$(GO) test -run '^$$' -bench ExecCPU -benchtime 300x ./cmd/cni
	$(GO) test -run '^$$' -bench Holders -benchtime 200x ./pkg/nic

# On the e2e node (root, the cluster binaries as make e2e builds them):
# pod creation to Running with and without an xdpq resource, side by side
# (20 pods each, p50 and their ratio), and the XdpqNode's API writes idle
# and under allocation churn at a real API server.
bench-e2e: e2e-binaries
	cd test/e2e && $(STATIC) $(GO) test -run '^$$' -bench PodStartupXdpq -benchtime 20x -timeout 30m .
	cd test/e2e && $(STATIC) $(GO) test -run '^$$' -bench PodStartupDRA -benchtime 20x -timeout 30m .
	cd test/e2e && $(STATIC) $(GO) test -run '^$$' -bench XdpqNodeWrites -benchtime 1x -timeout 30m ./crd

# The C client (clients/c): libxdpq.a, xdpq-rxdrop and xdpq-l2fwd in
# bin/c (clang or clang-14; its tests run with the others in make test).
cclient:
	$(MAKE) -C clients/c O=$(CURDIR)/bin/c

# Regenerate the BPF objects and their Go bindings (needs clang-14), the
# config's schema (docs/config.schema.json and its copy in the chart's
# values.schema.json), and the Grafana dashboard (built with Grafana's
# Foundation SDK in test/chart, which the main module does not depend on:
# charts/xdpq/files/xdpq-dashboard.json and its copy in docs/dashboard).
# Static (STATIC), as the image and test/chart build: the generators'
# packages (controller-gen's Kubernetes ones, the dashboard's SDK) are
# compiled once for them and for those.
generate:
	$(STATIC) $(GO) generate ./...
	cd test/chart && $(STATIC) $(GO) run ./cmd/dashboard

# staticcheck and errcheck, built from their modules the first time (CI
# starts without them).
tools:
	@test -x $(STATICCHECK) || $(GO) install honnef.co/go/tools/cmd/staticcheck@v0.8.2
	@test -x $(ERRCHECK) || $(GO) install github.com/kisielk/errcheck@v1.30.0

# errcheck: every error is handled or its dropping explained (`_ = f()`
# with a comment). .errcheck-excludes lists the few calls whose failure
# leaves nothing to act on, each with why. Tests are not checked
# (-ignoretests): most of their dropped errors are closes in t.Cleanup
# and defer after the test has asserted its outcome, over 500 of them;
# a setup step whose error matters is checked by hand (t.Fatal).
ERRCHECK_FLAGS := -ignoretests -exclude $(CURDIR)/.errcheck-excludes

# The main module is linted with the race detector's build flags (RACE),
# the flags of its tests (make test): the export data of its packages and
# their tests, which go vet, staticcheck and errcheck read, is then the
# tests' build, where static it was a build of its own (on a cold 2-core
# machine, go vet of this module and the e2e module took 5.6 minutes of
# CPU static; this module's alone, after its tests' build, 2 with RACE).
# The other modules
# are linted static (STATIC), as their tests and binaries are built.
# kubesd (a 90-line program over Prometheus's discovery package) gets go
# vet only: staticcheck and errcheck analyse every dependency from its
# source, Prometheus's too.
RACE := GOFLAGS="-race $(GOFLAGS)"
lint: tools
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(RACE) $(GO) vet ./...
	$(RACE) $(STATICCHECK) ./...
	$(RACE) $(ERRCHECK) $(ERRCHECK_FLAGS) ./...
	cd test/chart && $(STATIC) $(GO) vet ./... && $(STATIC) $(STATICCHECK) ./... && $(STATIC) $(ERRCHECK) $(ERRCHECK_FLAGS) ./...
	cd test/e2e && $(STATIC) $(GO) vet ./... && $(STATIC) $(STATICCHECK) ./... && $(STATIC) $(ERRCHECK) $(ERRCHECK_FLAGS) ./...
	cd test/e2e/kubebin/kubesd && $(STATIC) $(GO) vet ./...

demo:
	@echo "building xdpqdemo, xdpqperf, the xdpq CNI plugin, host-local and cnitool into bin/"
	@echo "(the first time takes a minute or two; -v lists each package as it is compiled)"
	$(GO) build -v -o bin/ ./cmd/xdpqdemo ./cmd/xdpqperf github.com/containernetworking/cni/cnitool
	$(GO) build -o bin/cni/xdpq ./cmd/cni
	$(GO) build -o bin/cni/host-local github.com/containernetworking/plugins/plugins/ipam/host-local
	./bin/xdpqdemo
