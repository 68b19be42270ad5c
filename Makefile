# Every target creates its own virtualenv (.venv) on first use; only Python 3.11 and make needed.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PKG_DIRS := consensus storage apps net jepsen gossip clustersend

.PHONY: demo test lint typecheck pytest bytecode soak sweeps sim-leaderless jepsen jepsen-leaderless bench bench-kv bench-leaderless bench-gossip bench-leaderless-gossip bench-scale bench-clustersend attack docs clean

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found (set PYTHON=/path/to/python3.11)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/phalanx demo

# mypy runs beside pytest (pytest on PYTEST_JOBS workers, 2 by default): its report is
# printed after pytest's, and the target fails if either does.
test: lint
	@$(MAKE) --no-print-directory typecheck > .typecheck.log 2>&1 & tc=$$!; \
	$(MAKE) --no-print-directory pytest; rc=$$?; \
	wait $$tc; trc=$$?; cat .typecheck.log; \
	[ $$trc -eq 0 ] || echo "make test: typecheck FAILED (above)"; \
	[ $$rc -eq 0 ] && [ $$trc -eq 0 ]

lint: $(STAMP)
	$(VENV)/bin/ruff check phalanx $(PKG_DIRS) tests bench

# mypy cannot follow setuptools' editable import hook, so it checks a tree of symlinks
# that lays the mapped folders out as the one `phalanx` package they install as.
typecheck: $(STAMP)
	@rm -rf .typecheck && mkdir -p .typecheck/phalanx
	@for f in phalanx/*; do ln -s ../../$$f .typecheck/phalanx/; done
	@for d in $(PKG_DIRS); do ln -s ../../$$d .typecheck/phalanx/$$d; done
	cd .typecheck && ../$(VENV)/bin/mypy --strict --config-file ../pyproject.toml -p phalanx

# The documentation site in site/ (mkdocs.yml): installs the `docs` extra on first use,
# generates docs/CLI.md from the parsers and the API reference from the .typecheck tree.
docs: typecheck
	@$(VENV)/bin/python -c "import mkdocs, mkdocstrings" 2>/dev/null || \
	  $(VENV)/bin/pip install -q -e '.[dev,docs]'
	$(PY) -m phalanx.cli.reference docs/CLI.md
	$(VENV)/bin/mkdocs build --strict
	@echo "site: site/index.html"

# pytest-xdist: PYTEST_JOBS worker processes (2: the cores of the reference VM; 0 runs the
# suite in this one process, as before). --dist loadfile keeps each test file on one worker,
# in order: module-scoped clusters and fixtures, and the cached runs some files share between
# their tests, are built once. Files are handed out in collection order as workers free up
# (xdist's default order, most tests first, would leave the few-test slow files, the harness
# runs and sweeps, for the end: one worker busy alone for their last minute).
# PYTEST_ARGS adds options (e.g. --durations=30, or paths to run only those).
PYTEST_JOBS ?= 2
PYTEST_ARGS ?=
pytest: bytecode
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -p no:cacheprovider -m "not long" \
	  -n $(PYTEST_JOBS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# Byte-compile the tree first: under PYTHONDONTWRITEBYTECODE=1 (these sessions' environment)
# every process a test spawns (a CLI call, a node) otherwise compiles each module it imports
# from source: ~0.1 s of CPU per node start, ~25% of the CLI tests' CPU (docs/BENCHMARKS.md,
# "CLI start-up"). checked-hash: a .pyc is used only while it matches its source's bytes.
# pytest itself runs without that variable, so its rewritten test modules are cached too
# (collection: ~8 s of CPU without the cache, ~2.5 s with it).
bytecode: $(STAMP)
	@$(PY) -m compileall -q --invalidation-mode checked-hash phalanx $(PKG_DIRS)

soak: $(STAMP)
	$(VENV)/bin/phalanx sim --protocol raft --seeds 10000 --faults all --jobs 2

# What `make test` leaves out or samples, for its ~10-minute budget: the full sweeps (300 Raft
# swarm seeds, make test: 60; 300 PBFT seeds with f Byzantine replicas, make test: 60) and the
# tests marked `long` (real-cluster harness runs: Raft register, PBFT twins, the leaderless
# run with a liar; the gossip and cross-shard demos; the leaderless pbft-mode and state-transfer
# sweeps; the 1,000-seed cluster-sending sweep; the bench smoke run).
# ~7 min on 2 cores (measured 6m31s).
sweeps: bytecode
	PHALANX_SWARM_SEEDS=300 PHALANX_PBFT_SEEDS=300 $(PY) -m pytest -q -p no:cacheprovider \
	  tests/jepsen/sim/test_sim_runs.py::test_swarm_sweep_passes \
	  tests/jepsen/sim/test_pbft_sweep.py::test_sweep_with_f_byzantine_replicas_mixes_n4_and_n7
	$(PY) -m pytest -q -p no:cacheprovider -m long

# The long leaderless sweep (docs/LEADERLESS.md "Simulation"): 1,000 seeds at n=4 under every
# fault kind but lose-disk (the core has no amnesia recovery: a node that lost its disk could
# sign conflicting endorsements), then 200 seeds with one Byzantine node (f=1), then 40 seeds
# of the long halves partition (--scenario long-halves: n1..n4 cut into two seeded halves for
# most of 6 s, 32 signing clients; issue 15's "DROP meets a commit in one drain"; make test
# runs seeds 3-9 of it, ~5.5 s of CPU a seed).
# SIM_LEADERLESS_ARGS adds options (e.g. --jobs 2).
SIM_LEADERLESS_FAULTS ?= pause,partition-one,partition-halves,partition-ring,partition-asymmetric,loss,duplicate,delay,straggle,clock-skew,kill,lose-unfsynced,crash-after-ready
# With a Byzantine node, no restarts yet: an equivocating endorser leaves honest replicas apart,
# much more often with restarts (docs/LEADERLESS.md "Simulation", gap 2).
SIM_LEADERLESS_BYZANTINE_FAULTS ?= pause,partition-one,partition-halves,partition-ring,partition-asymmetric,loss,duplicate,delay,straggle,clock-skew
SIM_LEADERLESS_ARGS ?=
sim-leaderless: $(STAMP)
	$(VENV)/bin/phalanx sim --protocol leaderless --nodes 4 --seeds 1000 \
	  --faults $(SIM_LEADERLESS_FAULTS) --time 1 --liveness 3 $(SIM_LEADERLESS_ARGS)
	$(VENV)/bin/phalanx sim --protocol leaderless --nodes 4 --seeds 200 --byzantine 1 \
	  --faults $(SIM_LEADERLESS_BYZANTINE_FAULTS) --time 1 --liveness 3 $(SIM_LEADERLESS_ARGS)
	$(VENV)/bin/phalanx sim --protocol leaderless --nodes 4 --seeds 40 --faults none \
	  --scenario long-halves --time 6 --liveness 4 --clients 32 --no-swarm --sized-budgets \
	  --set conflict_pct=60 --set ops_per_client=10000 --set think_ns=20000000 \
	  $(SIM_LEADERLESS_ARGS)

# The Jepsen matrix on real clusters, 60 s per cell (~30 min in all). Raft: 5 nodes, workload
# x nemesis. PBFT: 4 nodes (f=1), workload x nemesis, then workload x one Byzantine replica
# (an equivocating primary, a replica corrupting its replies, twins: two processes with one
# identity) under kill + partition. Gossip service (docs/GOSSIP.md "Jepsen"): Raft 5 and PBFT 4
# nodes publishing rumors under each JEPSEN_GOSSIP_NEMESES cell, then the deliberate-bug
# control (anti-entropy off), which must end INVALID (exit 1).
# Reports land in store/<test>/<timestamp>/index.html; store/latest is the newest.
JEPSEN_WORKLOADS ?= register bank set
JEPSEN_NEMESES   ?= kill pause partition-one,partition-halves,partition-ring,partition-asymmetric,isolate-leader,partition-bridge kill-leader,kill-majority,kill-all,truncate-wal,flip-checkpoint,lose-unfsynced lose-disk,kill,partition-one membership,kill,partition-halves all
JEPSEN_PBFT_WORKLOADS ?= register bank
JEPSEN_PBFT_NEMESES   ?= kill pause partition-one,partition-halves,partition-ring,partition-asymmetric,isolate-leader,partition-bridge
JEPSEN_PBFT_BYZANTINE ?= n1=equivocate corrupt_reply twins
JEPSEN_GOSSIP_NEMESES ?= kill,partition-one pause,partition-halves,partition-ring,loss,delay kill-leader,kill-majority,kill-all,clock-skew
GOSSIP_JEPSEN = $(VENV)/bin/phalanx jepsen run --workload gossip --time 60 --rate 10 \
	  --concurrency 3 --store store
# The leaderless core (4 endorsers, f = 1): every workload x nemesis mix in both stuck resolutions
# ("veto" is the default; each word of JEPSEN_LEADERLESS_RESOLUTIONS becomes
# --option stuck_resolution=WORD). docs/LEADERLESS.md "Running it" lists the runs.
JEPSEN_LEADERLESS_WORKLOADS   ?= bank set register
JEPSEN_LEADERLESS_NEMESES     ?= kill pause partition-one,partition-halves
JEPSEN_LEADERLESS_RESOLUTIONS ?= veto pbft
JEPSEN_LEADERLESS_TIME        ?= 60
jepsen-leaderless: $(STAMP)
	@status=0; for r in $(JEPSEN_LEADERLESS_RESOLUTIONS); do \
	for w in $(JEPSEN_LEADERLESS_WORKLOADS); do for n in $(JEPSEN_LEADERLESS_NEMESES); do \
	  echo "== jepsen: leaderless ($$r), 4 nodes, workload $$w, nemesis $$n"; \
	  $(VENV)/bin/phalanx jepsen run --protocol leaderless --option stuck_resolution=$$r \
	    --nodes 4 --workload $$w --nemesis $$n --time $(JEPSEN_LEADERLESS_TIME) --rate 20 \
	    --store store || status=1; \
	done; done; done; \
	exit $$status

jepsen: $(STAMP)
	@status=0; for w in $(JEPSEN_WORKLOADS); do for n in $(JEPSEN_NEMESES); do \
	  echo "== jepsen: raft, 5 nodes, workload $$w, nemesis $$n"; \
	  $(VENV)/bin/phalanx jepsen run --protocol raft --nodes 5 --workload $$w --nemesis $$n \
	    --time 60 --rate 40 --concurrency 5 --store store || status=1; \
	done; done; \
	for w in $(JEPSEN_PBFT_WORKLOADS); do for n in $(JEPSEN_PBFT_NEMESES); do \
	  echo "== jepsen: pbft, 4 nodes, workload $$w, nemesis $$n"; \
	  $(VENV)/bin/phalanx jepsen run --protocol pbft --nodes 4 --workload $$w --nemesis $$n \
	    --time 60 --rate 40 --concurrency 5 --store store || status=1; \
	done; for b in $(JEPSEN_PBFT_BYZANTINE); do \
	  echo "== jepsen: pbft, 4 nodes, workload $$w, kill + partition, Byzantine $$b"; \
	  $(VENV)/bin/phalanx jepsen run --protocol pbft --nodes 4 --workload $$w \
	    --nemesis kill,partition-one --byzantine $$b \
	    --time 60 --rate 40 --concurrency 5 --store store || status=1; \
	done; done; \
	for n in $(JEPSEN_GOSSIP_NEMESES); do \
	  echo "== jepsen: gossip service, raft, 5 nodes, nemesis $$n"; \
	  $(GOSSIP_JEPSEN) --protocol raft --nodes 5 --nemesis $$n || status=1; \
	done; \
	echo "== jepsen: gossip service, pbft, 4 nodes, nemesis kill,partition-one,pause"; \
	$(GOSSIP_JEPSEN) --protocol pbft --nodes 4 --nemesis kill,partition-one,pause || status=1; \
	echo "== jepsen: gossip control, anti-entropy off (must be INVALID)"; \
	$(GOSSIP_JEPSEN) --protocol raft --nodes 5 --nemesis kill,partition-one \
	  --gossip-bug no-anti-entropy; test $$? -eq 1 || status=1; \
	$(MAKE) --no-print-directory jepsen-leaderless || status=1; \
	exit $$status

bench: $(STAMP)
	$(PY) bench/storage.py
	$(PY) bench/sim.py

# phalanx vs PySyncObj vs etcd on loopback (etcd: `apt-get install etcd-server`; skipped if absent).
bench-kv: $(STAMP)
	$(VENV)/bin/pip install -q -e '.[dev,bench]'
	cd bench && ../$(PY) kv.py

# Raft (3) vs PBFT (4) vs leaderless (4) on loopback, TLS + fsync, interleaved rounds: 1-client
# commit p50/p99, commits/s at 64 clients with 0/10/50% conflicting writes, server CPU per
# commit, the issue-15 targets (~4 min). LEADERLESS_ARGS=--help for the knobs (--quick: ~20 s).
LEADERLESS_ARGS ?=
bench-leaderless: $(STAMP)
	$(PY) bench/leaderless.py $(LEADERLESS_ARGS)

# Gossip figures (docs/GOSSIP.md): contacts per rumor, rounds vs n, coverage under crashes,
# loss with anti-entropy, SWIM detection (~100 s of CPU; GOSSIP_ARGS=--quick: ~4 s).
GOSSIP_ARGS ?= --seeds 3
bench-gossip: $(STAMP)
	$(PY) bench/gossip.py $(GOSSIP_ARGS)

# Cluster-sending figures (docs/CLUSTER_SENDING.md): steps and inter-cluster messages per send
# for PCS, the permutation variant and the bijective baseline at 0/10/30% loss, against the
# theory (36,000 seeded sends, ~70 s of CPU; CLUSTERSEND_ARGS=--quick: ~5 s).
CLUSTERSEND_ARGS ?=
bench-clustersend: $(STAMP)
	$(PY) bench/cluster_sending.py $(CLUSTERSEND_ARGS)

# The leaderless core in the simulator at n = 20, 60, 180, broadcasts direct vs through gossip
# (docs/GOSSIP.md "Leaderless dissemination"): messages, bytes and the busiest node's messages per
# commit, commit latency p50/p99. LEADERLESS_GOSSIP_ARGS=--help for the knobs. Slow at n = 180
# (the full mesh is n^2 messages a broadcast): it runs 2 clients x 2 transactions there.
LEADERLESS_GOSSIP_ARGS ?=
bench-leaderless-gossip: $(STAMP)
	$(PY) bench/leaderless_gossip.py $(LEADERLESS_GOSSIP_ARGS)

# Raft, PBFT and leaderless over a 5-region WAN at n = 4..180 (docs/SCALE.md; hours of CPU
# for the whole matrix: SCALE_ARGS="--sizes 4,10,20" for the small sizes).
bench-scale: $(STAMP)
	$(PY) bench/scale.py $(SCALE_ARGS)

# A 2,000-socket TLS handshake/connection flood against a real 3-node Raft leader's client port
# (loopback, ~45 s): exits 1 if the leader lost leadership. ATTACK_ARGS=--help for the knobs.
ATTACK_ARGS ?=
attack: $(STAMP)
	$(PY) bench/attack_handshakes.py $(ATTACK_ARGS)

clean:
	rm -rf $(VENV) .typecheck .mypy_cache .pytest_cache .hypothesis build *.egg-info
	find phalanx $(PKG_DIRS) -name __pycache__ -type d -prune -exec rm -rf {} +
