# slimshard — top-level commands. `make demo` and `make test` work on a fresh Debian machine.
BUILD ?= build
JOBS ?= 2
DEMO_STEPS ?= 500
RANKS ?= 2
# As root, OpenMPI needs --allow-run-as-root; with more ranks than cores, --oversubscribe.
MPIRUN ?= mpirun $(if $(filter 0,$(shell id -u)),--allow-run-as-root,) --oversubscribe -n $(RANKS)

.PHONY: all deps build demo test bench format clean

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j$(JOBS)

# The main job: GPT (gpt-small) on the King James Bible, data-parallel on $(RANKS) ranks, then a sample of its text.
demo: build
	$(MPIRUN) $(BUILD)/slimshard train --model gpt-small --data kjv --steps $(DEMO_STEPS) --batch-size 16 --lr 3e-3 \
	  --eval-every 100 --metrics $(BUILD)/demo-metrics.jsonl --save-model $(BUILD)/demo-model.safetensors \
	  --sample-tokens 300 --prompt "And God said"

test: build
	cd $(BUILD) && ctest --output-on-failure -j1

format:
	clang-format -i $$(git ls-files '*.cpp' '*.h')

clean:
	rm -rf $(BUILD)
