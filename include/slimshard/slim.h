// slim.h — Slim-DP (Sun et al., arXiv 1709.09393) for replicated parameters: ranks train on their own slices
// with their own optimizers and, every τ steps, average their model deltas only over S = core ∪ explorer —
// the core being the most significant parameters (refreshed every q rounds), the explorer a fresh uniform
// draw of the rest — packed into one dense vector over indices every rank already knows. The formulas are in
// docs/slim-dp.md.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "slimshard/hash.h"

namespace slimshard {

class Communicator;
class ShardedParam;
class Work;

struct SlimOptions {
  int period = 1;           // τ: steps per communication round
  double core = 0.25;       // α: fraction of each tensor in the core
  double explore = 0.1;     // β: fraction of the non-core elements explored per round
  int refresh = 10;         // q: rounds between core refreshes
  int full_sync_every = 0;  // rounds between full synchronisations (0 = only at the end and before eval/save)
  uint64_t seed = 1337;     // shared by every rank: the explorer draw is the same everywhere
  // local: each rank's AdamW as is; corrected: its second moment for the N-rank batch (AdamW only)
  std::string adam = "local";
  // fp32: deltas travel as they are; bf16: rounded to bf16 (half the bytes), each rank keeping its own
  // rounding remainder in its weights so that it travels in a later round (error feedback)
  std::string wire = "fp32";
  int wire_bytes() const { return wire == "bf16" ? 2 : 4; }  // per exchanged element
  // forward: the original order, with the exchange one all-reduce per block in the forward's order, each
  // applied as it arrives and waited for where the next forward first uses the block — so the rest of the
  // round crosses the link under the blocks before; now: the step waits for the whole exchange and applies
  // it at once (the same values bit for bit); next: a round's exchange runs while the next step computes,
  // and its average is applied after that step, keeping the rank's progress made meanwhile
  // (w += mean − sent: a step late). docs/slim-dp.md.
  std::string apply = "forward";
};

class SlimSync {
 public:
  SlimSync(Communicator& comm, std::vector<ShardedParam*> params, const SlimOptions& o);
  // After optimizer step `step` (0-based): a round when (step + 1) is a multiple of τ.
  void after_step(int64_t step);
  // Every element averaged: the model is one model again (end of training, before evaluation and saving).
  void full_sync();
  // The weights were replaced (a checkpoint loaded, identical on every rank): they become the anchor, the
  // signal restarts and the core is chosen again.
  void restart();
  // What a checkpoint holds for a resumed run to continue bit for bit: per slim param, views of its slice of
  // the signal (F32) and of the core mask (U8), both identical on every rank; loading writes into them. The
  // weights saved are one model (a save follows a full sync), so they are also the anchor. After loading,
  // resumed() recounts the core and restores the round count (which seeds the explorer) and the digest.
  std::vector<std::pair<std::string, at::Tensor>> state_of(const ShardedParam* p);
  // What a checkpoint records of Slim-DP: its settings, the round count and the selection digest.
  nlohmann::json state_json() const;
  // Whether a checkpoint's record lets this run continue bit for bit: the same settings, an integer round
  // count and digest. (The caller checks that the checkpoint holds state_of() for every slim param.)
  bool can_resume_from(const nlohmann::json& saved) const;
  // After a checkpoint's weights are loaded: continue from its record when `exact` (state_of() loaded too),
  // else restart() with the loaded weights as the anchor and the core chosen again.
  void resume_from(const nlohmann::json& saved, bool exact);
  const SlimOptions& options() const { return o_; }

  int64_t rounds() const { return rounds_; }
  // Fraction of the slim elements exchanged in the last round (1 after a full sync).
  double last_fraction() const { return last_fraction_; }
  // Flat indices (into the slim params in the order given, concatenated) that round `round` selects, in
  // increasing order; and the current core. For tests and inspection.
  at::Tensor selection(int64_t round) const;
  at::Tensor core() const;
  // A digest of every selection so far: equal on all ranks when they all chose the same elements.
  int64_t selection_digest() const { return static_cast<int64_t>(digest_); }
  // Max and mean |w_r − mean_r w_r| over the slim elements (a collective).
  struct Divergence {
    double max = 0, mean = 0;
  };
  Divergence divergence();
  // Bytes of Slim-DP's own buffers (anchor, signal, masks, packed round), sized at start.
  int64_t state_bytes() const;
  int64_t elements() const { return total_; }

 private:
  void resumed(int64_t rounds, int64_t digest);
  void refresh_core();
  std::vector<int64_t> explorer(int64_t round) const;
  int64_t mark_selection(const std::vector<int64_t>& explorer, std::vector<uint8_t>& selected) const;
  // Packs the selected deltas as Wire, averages them across ranks and applies the average.
  template <class Wire>
  void exchange(std::vector<Wire>& packed, int64_t count);
  // --slim-apply next: the round packs and starts its all-reduce (launch); the next round, a full sync or a
  // divergence check first waits for it and applies it (finish).
  template <class Wire>
  void launch(std::vector<Wire>& packed, std::vector<Wire>& sent, int64_t count);
  template <class Wire>
  void finish(std::vector<Wire>& packed, const std::vector<Wire>& sent);
  // --slim-apply forward: pack as exchange() does, then one all-reduce per block (blocks_), each applying
  // its block on the comm thread once averaged (apply_average) and left pending on the block's params.
  template <class Wire>
  void launch_per_block(std::vector<Wire>& packed, int64_t count);
  // The averaged deltas `mean` (packed from the first selected element at or after lo) applied to
  // elements [lo, hi): the anchor takes them, the weights too, keeping the bf16 wire's rounding remainder.
  template <class Wire>
  void apply_average(const Wire* mean, int64_t lo, int64_t hi);
  void finish_pending();

  Communicator& comm_;
  SlimOptions o_;
  std::vector<ShardedParam*> params_;
  std::vector<int64_t> offsets_;  // params_[i] is weights_[offsets_[i], offsets_[i + 1])
  // apply=forward: the params of each block (fusion_block), as [first, last) into params_, in their order
  std::vector<std::pair<size_t, size_t>> blocks_;
  int64_t rounds_ = 0, total_ = 0, core_count_ = 0;
  at::Tensor weights_;  // every slim param's value, one buffer (the params' masters are views of it)
  at::Tensor anchor_;   // the value at the last round, identical on every rank
  at::Tensor signal_;   // Σ |averaged delta| per element since the last core refresh, identical everywhere
  std::vector<uint8_t> in_core_;   // 1 where the element is in the core (the explorer is drawn each round)
  std::vector<uint8_t> selected_;  // this round's core ∪ explorer
  std::vector<float> packed_;      // this round's selected deltas, then their average (fp32 wire)
  std::vector<c10::BFloat16> packed16_;  // the same, bf16 wire
  std::vector<float> sent_;              // apply=next: what this rank put on the wire, until applied
  std::vector<c10::BFloat16> sent16_;
  std::shared_ptr<Work> pending_;  // apply=next: the round in flight
  double last_fraction_ = 0;
  uint64_t digest_ = kFnvOffset;
};

}  // namespace slimshard
