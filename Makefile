# Sluice. `make test` is what CI runs; it installs what the tests need.
GO        ?= go
PKGS      ?= ./...
# -vet=off: make test runs all of go vet itself, so go test's own subset of
# it on every package would be done twice. -ldflags=-w: the test binaries
# carry no DWARF, which nothing in a test run reads (stack traces and race
# reports come from the symbol table); a -race test binary links with
# about a quarter less CPU and is a sixth smaller (BENCHMARKS.md, "make
# test wall time").
TEST_FLAGS ?= -race -count=1 -timeout 20m -vet=off -ldflags=-w
export PATH := $(PATH):$(shell $(GO) env GOPATH)/bin

.PHONY: all build test deps bench proto vet fmt soak clean fuzz image mutate

all: build

build:
	$(GO) build -o bin/ ./cmd/...

# image writes Sluice's container image (every command, static, non-root,
# CA certificates) as a tar for `docker load` / `podman load`, without a
# container daemon; it prints how to load, push and deploy it.
IMAGE     ?= sluicehq/sluice
IMAGE_TAG ?=
IMAGE_TAR ?= bin/sluice-image.tar
image:
	$(GO) run ./scripts/imagebuild -o $(IMAGE_TAR) -image $(IMAGE) $(if $(IMAGE_TAG),-tag $(IMAGE_TAG))

# deps installs the system packages the tests talk to: a real redis-server,
# and promtool (Debian package prometheus) for the alert unit tests.
deps:
	@scripts/install-deps.sh

# NORACE are packages with no concurrency of their own (the virtual-time
# simulator's runner: one goroutine per world), tested without the race
# detector, which multiplies their run time by four and made them the
# longest test of the suite; the scale simulator, whose only
# concurrency is per-region and per-shard work on disjoint state
# (go test -race -run TestDeterministic ./sim/scale/ checks it); and the
# simulated deployment (sim/world) and the global tier's pure core
# (pkg/hierarchy), whose tests run on one goroutine: no code they run
# starts another, so the detector has nothing to check there and only
# slowed them (sim/world: 64 s of CI time with it; 11 s without on a busy
# machine where it took 173 s with it). The hierarchy's Allocator is used
# concurrently by pkg/allocator, whose tests run with -race. The image
# builder (internal/imagebuild) starts no goroutine either: its tests copy
# the four commands' binaries through tar writers and readers several
# times, and the detector checked every byte copied (20 of the test's 27 s
# on an idle machine, for a package whose code runs on one goroutine).
# The simulator's command (sim) runs those packages and sim/live (LIVE
# below); its tests play virtual runs (and -live only
# to be refused), so the detector only slowed them: 87 s with it, 9 s
# without, on a busy machine.
#
# The same holds for the pure packages in NORACE_PURE: parsers, the config
# and its reference, the key space, the wire mapping of reports, the
# oracle, the scenario model and the simulator's report. Neither they nor
# their tests start a goroutine or share memory (no go statement, sync or
# channel in them), and what their tests run of other packages is their
# pure code too, so the detector has nothing to find there; each cost a
# -race build and link of its own (the build of the -race test binaries was
# about a third of the suite's CPU) and ran slower under it (pkg/config 14 s
# and sim/report 15 s with it). A package of that list that starts
# concurrency moves back.
#
# They run beside the -race packages rather than after them: those mostly
# wait on epochs, TTLs and stopped servers (0.3-0.6 CPU s per wall s, see
# BENCHMARKS.md), and these are CPU-bound virtual runs that fill the idle
# core, instead of a serial tail of a minute and a half. They run at the
# lowest CPU priority (nice 19): they only take what the -race packages
# leave idle, and starve none of their real-time tests (sim/live's daemons
# at three times real speed failed beside them at normal priority while
# other work loaded the machine). Their output is held back and printed
# after the -race packages' so the two do not mix. Once the -race
# packages are done, nothing real-time is left to protect: what remains of
# them goes back to normal priority (renice, which needs root, as CI is;
# otherwise they finish at nice 19), so a busy machine does not hold the
# suite's end at the lowest priority.
#
# go vet runs first in that queue, at the same priority, instead of
# before everything: it type-checks every package and the facts of their
# dependencies, about 54 s of the suite's wall time on 2 cores with
# nothing else running (BENCHMARKS.md, "make test wall time"), and
# shares the dependencies' compilation without -race with the packages
# after it. A finding still fails the target, reported with their output.
NORACE_PURE ?= $(addprefix github.com/sluicehq/sluice/,internal/envcount internal/etcdflags internal/flagenv internal/readme internal/shrink internal/structfield pkg/config pkg/config/internal/configdoc pkg/envoyrls/importer pkg/quota pkg/regionsync pkg/shard sim/engine sim/oracle sim/report sim/scenario sim/scenarios sim/traffic deploy/envoy deploy/regions)
NORACE ?= github.com/sluicehq/sluice/sim/runner github.com/sluicehq/sluice/sim github.com/sluicehq/sluice/sim/scale github.com/sluicehq/sluice/sim/world github.com/sluicehq/sluice/pkg/hierarchy github.com/sluicehq/sluice/internal/imagebuild $(NORACE_PURE)

# LIVE (sim/live) plays scenarios on real daemons in real time at three
# to six times real speed: its tests are bound by CPU, and the race
# detector more than doubled their CPU (291 CPU s for 171 s of wall time
# with it, 140 for 151 s without, run alone; BENCHMARKS.md, "Live mode's
# tests without the race detector"), about a seventh of the suite's. They run without -race in
# a job of their own beside the -race packages, at normal priority (their
# daemons must keep pace with the scenario's clock), and then LIVE_RACE,
# the test that drives the most of the package's own concurrent code (the
# lease and region-report fault interceptors, replays, the isolation
# poller) beside the daemons, again with -race. The daemons' code runs
# under -race in their own packages' tests (pkg/regional, pkg/lease,
# pkg/allocator, e2e). `go test -race ./sim/live/` runs them all with it.
LIVE ?= github.com/sluicehq/sluice/sim/live
LIVE_RACE ?= ^TestLivePlaysRetries$$

# SLOW are the packages whose tests run longest under -race (a quarter of a
# minute to two minutes each), longest first. go test starts packages in
# the order it is given them, so these start first and the short ones
# fill in beside them, instead of a long one started late in go list's
# order (pkg/regional, sim/report) running on after the short ones are
# done. A package of PKGS not named here runs after them, in go list's
# order.
SLOW ?= github.com/sluicehq/sluice/pkg/regional github.com/sluicehq/sluice/pkg/lease github.com/sluicehq/sluice/e2e github.com/sluicehq/sluice/pkg/luascripts github.com/sluicehq/sluice/pkg/configstore github.com/sluicehq/sluice/pkg/allocator github.com/sluicehq/sluice/cmd/regional github.com/sluicehq/sluice/pkg/agent github.com/sluicehq/sluice/cmd/sluicectl github.com/sluicehq/sluice/pkg/envoyrls github.com/sluicehq/sluice/scripts/mutate

test: deps
	@test -z "$$(gofmt -l .)" || (echo "gofmt would change:"; gofmt -l .; exit 1)
	@pkgs="$$($(GO) list $(PKGS) | grep -v -x -F $(addprefix -e ,$(NORACE) $(LIVE)))"; \
	first="$$(for p in $(SLOW); do printf '%s\n' $$pkgs | grep -x -F -e "$$p"; done)"; \
	rest="$$(printf '%s\n' $$pkgs | grep -v -x -F $(addprefix -e ,$(SLOW)))"; \
	idle_log="$$(mktemp)"; trap 'rm -f "$$idle_log"' EXIT; \
	echo "nice -n 19 $(GO) vet ./... && nice -n 19 $(GO) test $(filter-out -race,$(TEST_FLAGS)) $(NORACE) (beside the next; their output follows it)"; \
	nice -n 19 setsid -w sh -c 'start=$$(date +%s); vet_rc=0; echo "$(GO) vet ./..."; $(GO) vet ./... || vet_rc=$$?; \
	  test $$vet_rc -eq 0 || echo "go vet failed (exit $$vet_rc)"; \
	  norace_rc=0; echo "$(GO) test $(filter-out -race,$(TEST_FLAGS)) $(NORACE)"; \
	  $(GO) test $(filter-out -race,$(TEST_FLAGS)) $(NORACE) || norace_rc=$$?; \
	  echo "(go vet and the packages without -race took $$(( $$(date +%s) - start )) s)"; \
	  test $$vet_rc -eq 0 && test $$norace_rc -eq 0' >"$$idle_log" 2>&1 & idle=$$!; \
	live_log="$$(mktemp)"; trap 'rm -f "$$idle_log" "$$live_log"' EXIT; \
	echo "$(GO) test $(filter-out -race,$(TEST_FLAGS)) $(LIVE) && $(GO) test $(TEST_FLAGS) -run '$(LIVE_RACE)' $(LIVE) (beside the next; their output follows it)"; \
	setsid -w sh -c '$(GO) test $(filter-out -race,$(TEST_FLAGS)) $(LIVE) && $(GO) test $(TEST_FLAGS) -run '"'"'$(LIVE_RACE)'"'"' $(LIVE)' >"$$live_log" 2>&1 & live=$$!; \
	trap 'kill -TERM -$$idle -$$live 2>/dev/null; exit 130' INT TERM HUP; \
	echo $(GO) test $(TEST_FLAGS) $$first $$rest; \
	race_rc=0; $(GO) test $(TEST_FLAGS) $$first $$rest || race_rc=$$?; \
	renice -n 0 -p $$idle -g $$idle >/dev/null 2>&1 || true; \
	live_rc=0; wait $$live || live_rc=$$?; \
	cat "$$live_log"; \
	idle_rc=0; wait $$idle || idle_rc=$$?; \
	cat "$$idle_log"; \
	test $$race_rc -eq 0 && test $$live_rc -eq 0 && test $$idle_rc -eq 0
	cd deploy/observability/promql && $(GO) vet ./... && $(GO) test -count=1 ./...

bench: deps
	$(GO) test -run '^$$' -bench . -benchmem $(BENCH_FLAGS) $(PKGS)

# fuzz runs every Fuzz target in the repository for FUZZTIME each (make test
# runs their seed corpora only).
FUZZTIME ?= 30s
fuzz: deps
	@for dir in $$(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -n1 dirname | sort -u); do \
	  for f in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$dir/*_test.go); do \
	    echo "fuzz $$dir $$f ($(FUZZTIME))"; \
	    $(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime $(FUZZTIME) $$dir || exit 1; \
	  done; \
	done

# mutate runs PKG's tests against small changes to its code (operators,
# conditions, literals, branches; see scripts/mutate) through go test
# -overlay, so the tree is never written, and prints the changes no test
# noticed and the mutation score. FILES limits it to some files (base
# names, comma-separated; embedded .lua scripts too), MAX samples that
# many mutants (SEED picks them), RUN and SKIP are go test's -run and
# -skip; MUTATE_FLAGS passes more (-j 2, -race, -timeout 1m, -at
# file:line, -list, -lua). Not part of make test: a whole package takes
# hours; e.g.
#   make mutate PKG=./pkg/hierarchy FILES=waterfill.go,fence.go MAX=100
#   make mutate PKG=./pkg/luascripts FILES=release.lua SKIP=TestMemoryPerKey
PKG   ?= ./pkg/hierarchy
FILES ?=
MAX   ?= 0
SEED  ?= 1
RUN   ?=
SKIP  ?=
mutate:
	$(GO) run ./scripts/mutate -files '$(FILES)' -max $(MAX) -seed $(SEED) -run '$(RUN)' -skip '$(SKIP)' $(MUTATE_FLAGS) $(PKG)

# soak runs the long chaos and soak runs (not part of make test).
soak: deps
	SLUICE_SOAK=1 $(GO) test -count=1 -timeout 60m -run 'Soak|Chaos' $(PKGS)

proto:
	@command -v protoc >/dev/null || (apt-get update -qq && apt-get install -y -qq protobuf-compiler)
	@command -v protoc-gen-go >/dev/null || $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	@command -v protoc-gen-go-grpc >/dev/null || $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.5.1
	cd api/sluice/v1 && protoc -I. --go_out=paths=source_relative:. --go-grpc_out=paths=source_relative:. sluice.proto

vet:
	$(GO) vet ./...

fmt:
	gofmt -w .

clean:
	rm -rf bin
