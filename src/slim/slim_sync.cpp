// slim_sync.cpp — Slim-DP rounds: core selection from values every rank agrees on (no message needed),
// explorer draws from a shared seed, one packed all-reduce of the selected deltas per round (see slim.h,
// docs/slim-dp.md).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <type_traits>

#include "slimshard/comm.h"
#include "slimshard/hash.h"
#include "slimshard/sharded_param.h"
#include "slimshard/slim.h"

namespace slimshard {

SlimSync::SlimSync(Communicator& comm, std::vector<ShardedParam*> params, const SlimOptions& o)
    : comm_(comm), o_(o), params_(std::move(params)) {
  at::NoGradGuard no_grad;
  if (params_.empty()) throw std::logic_error("SlimSync: no params");
  for (ShardedParam* p : params_) {
    offsets_.push_back(total_);
    total_ += p->numel();
  }
  offsets_.push_back(total_);
  // One buffer for every slim param's value: a round is a handful of ops over it, not a handful per tensor.
  weights_ = at::empty({total_}, params_[0]->master().options());
  for (size_t i = 0; i < params_.size(); ++i)
    params_[i]->set_value_storage(weights_.slice(0, offsets_[i], offsets_[i + 1]));
  anchor_ = weights_.clone();  // every rank starts from rank 0's weights, so the anchors agree
  signal_ = at::zeros_like(weights_);
  in_core_.assign(static_cast<size_t>(total_), 0);
  if (weights_.scalar_type() != at::kFloat) throw std::logic_error("SlimSync: fp32 params only");
  if (o_.wire != "fp32" && o_.wire != "bf16") throw std::logic_error("SlimSync: wire must be fp32 or bf16");
  if (o_.apply != "next" && o_.apply != "now" && o_.apply != "forward")
    throw std::logic_error("SlimSync: apply must be next, now or forward");
  for (size_t i = 0; i < params_.size(); ++i)
    if (blocks_.empty() || fusion_block(params_[i]->name()) != fusion_block(params_[i - 1]->name()))
      blocks_.emplace_back(i, i + 1);
    else
      blocks_.back().second = i + 1;
  refresh_core();
  // Sized once at start (the design's buffer rule): the selection mask, and the packed round at its expected
  // size (core + explorer, with room for the explorer's spread).
  selected_.assign(static_cast<size_t>(total_), 0);
  const auto expected = static_cast<size_t>(
      static_cast<double>(core_count_) + 1.1 * o_.explore * static_cast<double>(total_ - core_count_) + 16);
  const bool next = o_.apply == "next";
  if (o_.wire_bytes() == 2)
    packed16_.reserve(expected), sent16_.reserve(next ? expected : 0);
  else
    packed_.reserve(expected), sent_.reserve(next ? expected : 0);
}

// Significance of element i of a tensor: |a_i| / mean|a| + λ·s_i with λ = 1 / mean(s): the magnitude of the
// agreed weight and the accumulated magnitude of its agreed updates, each relative to its tensor's mean. Both
// are identical on every rank, so every rank picks the same core without exchanging a message.
void SlimSync::refresh_core() {
  std::fill(in_core_.begin(), in_core_.end(), 0);
  core_count_ = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t n = offsets_[i + 1] - offsets_[i];
    const int64_t k = std::min<int64_t>(n, static_cast<int64_t>(std::ceil(o_.core * static_cast<double>(n))));
    core_count_ += k;
    if (k >= n) {
      std::fill(in_core_.begin() + offsets_[i], in_core_.begin() + offsets_[i + 1], 1);
      continue;
    }
    at::Tensor sig = anchor_.slice(0, offsets_[i], offsets_[i + 1]).abs();
    const double mag = sig.mean().item<double>();
    if (mag > 0) sig.div_(mag);
    const at::Tensor upd = signal_.slice(0, offsets_[i], offsets_[i + 1]);
    const double mean_upd = upd.mean().item<double>();
    if (mean_upd > 0) sig.add_(upd, 1.0 / mean_upd);
    // Identical inputs through the same kernel: every rank gets the same indices, ties included.
    const at::Tensor top = std::get<1>(sig.topk(k, /*dim=*/0, /*largest=*/true, /*sorted=*/false));
    const auto* t = top.data_ptr<int64_t>();
    for (int64_t j = 0; j < k; ++j) in_core_[offsets_[i] + t[j]] = 1;
  }
  for (int64_t i = 0; i < total_; ++i)  // the digest covers every core chosen
    if (in_core_[static_cast<size_t>(i)]) digest_ = fnv1a(digest_, static_cast<uint64_t>(i));
  signal_.zero_();
}

// The explorer of round `round`: every element with probability β, independently (so ~β of the non-core), in
// increasing order, drawn as geometric gaps from a stream every rank seeds alike — O(β·n) draws, no pass over
// n.
std::vector<int64_t> SlimSync::explorer(int64_t round) const {
  std::vector<int64_t> out;
  if (!(o_.explore > 0) || core_count_ == total_) return out;
  out.reserve(static_cast<size_t>(o_.explore * static_cast<double>(total_) * 1.1) + 16);
  uint64_t state = mix64(o_.seed ^ mix64(static_cast<uint64_t>(round) + 1));
  const double log_keep = std::log1p(-std::min(o_.explore, 1.0 - 1e-12));
  for (int64_t i = -1;;) {
    const double u = (static_cast<double>(splitmix64_next(state) >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    const double gap = std::floor(std::log(u) / log_keep);  // Geometric(β) failures
    if (gap >= static_cast<double>(total_ - i - 1)) break;
    i += 1 + static_cast<int64_t>(gap);
    out.push_back(i);
  }
  return out;
}

// selected = core ∪ explorer; returns how many.
int64_t SlimSync::mark_selection(const std::vector<int64_t>& explorer, std::vector<uint8_t>& selected) const {
  selected = in_core_;
  int64_t count = core_count_;
  for (int64_t i : explorer) {
    count += 1 - selected[static_cast<size_t>(i)];
    selected[static_cast<size_t>(i)] = 1;
  }
  return count;
}

namespace {
// The selected deltas w − a of `total` elements, packed in index order into `packed` (count of them, then one
// zero read by the last unselected elements when applying); the returned tensor views the count packed ones.
template <class Wire>
at::Tensor pack_selected(const float* w, const float* a, const uint8_t* sel, int64_t total,
                         std::vector<Wire>& packed, int64_t count) {
  packed.resize(static_cast<size_t>(count + 1));
  Wire* p = packed.data();
  int64_t m = 0;
  for (int64_t i = 0; i < total; ++i) {
    p[m] = static_cast<Wire>(w[i] - a[i]);
    m += sel[i];
  }
  p[count] = Wire(0);
  return at::from_blob(p, {count}, c10::CppTypeToScalarType<Wire>::value);
}
}  // namespace

// One round's exchange over the selection. Pack the selected deltas d = w − a in index order, the same on
// every rank, rounded to Wire. Branch-free: every element is written at the cursor, which advances only past
// selected ones (the selection is random, so a branch would mispredict often); `packed` keeps its capacity
// between rounds. Then apply the average: a[S] += mean delta, identical everywhere; w[S] = a[S] + this rank's
// rounding remainder d − Wire(d) (zero on the fp32 wire), which stays in w − a and so travels in a later
// round (error feedback) rather than being lost. The signal accumulates |mean delta|.
template <class Wire>
void SlimSync::exchange(std::vector<Wire>& packed, int64_t count) {
  comm_
      .all_reduce(pack_selected(weights_.data_ptr<float>(), anchor_.data_ptr<float>(), selected_.data(),
                                total_, packed, count),
                  ReduceOp::avg)
      ->wait();
  apply_average(packed.data(), 0, total_);
}

// Reads mean[m] at unselected elements too, multiplied by 0: the next selected one's average, or the zero
// packed after the last.
template <class Wire>
void SlimSync::apply_average(const Wire* p, int64_t lo, int64_t hi) {
  float* w = weights_.data_ptr<float>();
  float* a = anchor_.data_ptr<float>();
  float* s = signal_.data_ptr<float>();
  const uint8_t* sel = selected_.data();
  int64_t m = 0;
  // Branch-free too: the delta is zeroed and w keeps its bits where not selected.
  auto* wb = reinterpret_cast<uint32_t*>(w);
  for (int64_t i = lo; i < hi; ++i) {
    const uint32_t keep = sel[i] - 1u;  // all ones where not selected
    float remainder = 0;
    if constexpr (!std::is_same_v<Wire, float>) {
      const float d = w[i] - a[i];
      remainder = d - static_cast<float>(static_cast<Wire>(d));
    }
    const float delta = static_cast<float>(p[m]) * static_cast<float>(sel[i]);
    a[i] += delta;
    const float v = a[i] + remainder;
    uint32_t vb;
    std::memcpy(&vb, &v, 4);
    wb[i] = (wb[i] & keep) | (vb & ~keep);
    s[i] += std::fabs(delta);
    m += sel[i];
  }
}

// --slim-apply next: pack the selected deltas (as exchange() does), keep a copy of what was sent, and start
// the all-reduce without waiting for it.
template <class Wire>
void SlimSync::launch(std::vector<Wire>& packed, std::vector<Wire>& sent, int64_t count) {
  at::Tensor t = pack_selected(weights_.data_ptr<float>(), anchor_.data_ptr<float>(), selected_.data(),
                               total_, packed, count);
  sent.assign(packed.begin(), packed.end());
  pending_ = comm_.all_reduce(t, ReduceOp::avg);
}

// The average arrived a step later: the anchor takes it, a[S] += mean; the weights keep what this rank did
// since it sent: w[S] += mean − sent. (What it sent, w − a then, leaves w − a; its rounding remainder on the
// bf16 wire stays in w − a as in exchange().) The signal accumulates |mean|.
template <class Wire>
void SlimSync::finish(std::vector<Wire>& packed, const std::vector<Wire>& sent) {
  pending_->wait();
  pending_.reset();
  float* w = weights_.data_ptr<float>();
  float* a = anchor_.data_ptr<float>();
  float* s = signal_.data_ptr<float>();
  const uint8_t* sel = selected_.data();
  const Wire* mean = packed.data();
  const Wire* mine = sent.data();
  int64_t m = 0;
  for (int64_t i = 0; i < total_; ++i) {
    const float on = static_cast<float>(sel[i]);
    const float delta = static_cast<float>(mean[m]) * on;
    a[i] += delta;
    w[i] += delta - static_cast<float>(mine[m]) * on;
    s[i] += std::fabs(delta);
    m += sel[i];
  }
}

// The packed round is cut where blocks begin (the selection is in index order, so each block's selected
// deltas are contiguous); the all-reduces go out in the forward's order. Each applies its block when it
// arrives and refreshes the block's working copies; the block's params hold it as a pending gather, which
// whatever reads them first waits for (materialize() in the forward, DataParallel's wait at the end of the
// backward for a param the forward did not use). A block with nothing selected changes nothing.
template <class Wire>
void SlimSync::launch_per_block(std::vector<Wire>& packed, int64_t count) {
  at::Tensor t = pack_selected(weights_.data_ptr<float>(), anchor_.data_ptr<float>(), selected_.data(),
                               total_, packed, count);
  const uint8_t* sel = selected_.data();
  int64_t m = 0;
  for (const auto& [first, last] : blocks_) {
    const int64_t lo = offsets_[first], hi = offsets_[last];
    int64_t k = 0;
    for (int64_t i = lo; i < hi; ++i) k += sel[i];
    if (k == 0) continue;
    const Wire* mean = packed.data() + m;
    WorkPtr w =
        comm_.all_reduce(t.slice(0, m, m + k), ReduceOp::avg, [this, mean, lo, hi, f = first, l = last] {
          apply_average(mean, lo, hi);
          for (size_t i = f; i < l; ++i) params_[i]->refresh_working();  // (it guards grad mode itself)
        });
    for (size_t i = first; i < last; ++i) params_[i]->set_pending_gather(w);
    m += k;
  }
}

void SlimSync::finish_pending() {
  for (ShardedParam* p : params_) p->wait_gather();  // apply=forward: the blocks' rounds the params hold
  if (!pending_) return;
  at::NoGradGuard no_grad;
  if (o_.wire_bytes() == 2)
    finish(packed16_, sent16_);
  else
    finish(packed_, sent_);
}

void SlimSync::after_step(int64_t step) {
  finish_pending();  // the last round's average, a step later (apply=next)
  if ((step + 1) % o_.period != 0) return;
  if (o_.full_sync_every > 0 && (rounds_ + 1) % o_.full_sync_every == 0) {
    full_sync();
    return;
  }
  if (rounds_ > 0 && rounds_ % o_.refresh == 0) refresh_core();
  at::NoGradGuard no_grad;
  const std::vector<int64_t> drawn = explorer(rounds_);
  const int64_t count = mark_selection(drawn, selected_);
  for (int64_t i : drawn) digest_ = fnv1a(digest_, static_cast<uint64_t>(i));
  digest_ = fnv1a(digest_, static_cast<uint64_t>(count));
  if (o_.apply == "forward" && o_.wire_bytes() == 2)
    launch_per_block(packed16_, count);
  else if (o_.apply == "forward")
    launch_per_block(packed_, count);
  else if (o_.apply == "next" && o_.wire_bytes() == 2)
    launch(packed16_, sent16_, count);
  else if (o_.apply == "next")
    launch(packed_, sent_, count);
  else if (o_.wire_bytes() == 2)
    exchange(packed16_, count);
  else
    exchange(packed_, count);
  last_fraction_ = static_cast<double>(count) / static_cast<double>(total_);
  ++rounds_;
}

at::Tensor SlimSync::selection(int64_t round) const {
  std::vector<uint8_t> selected;
  mark_selection(explorer(round), selected);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < total_; ++i)
    if (selected[static_cast<size_t>(i)]) out.push_back(i);
  return at::tensor(out, at::kLong);
}

at::Tensor SlimSync::core() const {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < total_; ++i)
    if (in_core_[static_cast<size_t>(i)]) out.push_back(i);
  return at::tensor(out, at::kLong);
}

void SlimSync::restart() {
  anchor_.copy_(weights_);
  signal_.zero_();
  refresh_core();
}

std::vector<std::pair<std::string, at::Tensor>> SlimSync::state_of(const ShardedParam* p) {
  const auto it = std::find(params_.begin(), params_.end(), p);
  if (it == params_.end()) throw std::logic_error("SlimSync::state_of: not a slim param");
  const int64_t lo = offsets_[static_cast<size_t>(it - params_.begin())],
                hi = offsets_[static_cast<size_t>(it - params_.begin()) + 1];
  at::Tensor core = at::from_blob(in_core_.data(), {total_}, at::kByte);
  return {{"slim_signal", signal_.slice(0, lo, hi)}, {"slim_core", core.slice(0, lo, hi)}};
}

void SlimSync::resumed(int64_t rounds, int64_t digest) {
  anchor_.copy_(weights_);
  core_count_ = 0;
  for (uint8_t& c : in_core_) core_count_ += (c = c != 0);
  rounds_ = rounds;
  digest_ = static_cast<uint64_t>(digest);
}

// Every element: one all-reduce of w − a; the model is one model again.
void SlimSync::full_sync() {
  finish_pending();
  at::NoGradGuard no_grad;
  at::Tensor avg = weights_ - anchor_;
  comm_.all_reduce(avg, ReduceOp::avg)->wait();
  weights_.copy_(anchor_.add_(avg));
  signal_.add_(avg.abs_());
  last_fraction_ = 1;
  ++rounds_;
  // Outside a step (before evaluation or a save) nothing else refreshes the bf16 working copies.
  for (ShardedParam* p : params_) p->refresh_working();
}

SlimSync::Divergence SlimSync::divergence() {
  finish_pending();
  at::NoGradGuard no_grad;
  at::Tensor mean = weights_.clone();
  comm_.all_reduce(mean, ReduceOp::avg)->wait();
  at::Tensor d = mean.sub_(weights_).abs_();
  at::Tensor maxes = at::empty({comm_.world()}, d.options());
  comm_.all_gather(maxes, d.max().reshape({1}))->wait();
  at::Tensor sum = d.sum().to(at::kDouble).reshape({1});
  comm_.all_reduce(sum, ReduceOp::avg)->wait();
  Divergence out;
  out.max = maxes.max().item<double>();
  out.mean = sum.item<double>() / static_cast<double>(total_);
  return out;
}

int64_t SlimSync::state_bytes() const {
  return static_cast<int64_t>(anchor_.nbytes() + signal_.nbytes() + in_core_.size() + selected_.size() +
                              (packed_.capacity() + sent_.capacity()) * sizeof(float) +
                              (packed16_.capacity() + sent16_.capacity()) * sizeof(c10::BFloat16));
}

nlohmann::json SlimSync::state_json() const {
  return {{"period", o_.period},
          {"core", o_.core},
          {"explore", o_.explore},
          {"refresh", o_.refresh},
          {"full_sync_every", o_.full_sync_every},
          {"wire", o_.wire},
          {"apply", o_.apply},
          {"seed", o_.seed},
          {"rounds", rounds_},
          {"digest", selection_digest()}};
}

bool SlimSync::can_resume_from(const nlohmann::json& saved) const {
  if (!saved.is_object()) return false;
  // now and forward leave the same state, bit for bit: either continues the other
  auto same_order = [](nlohmann::json j) {
    if (j.value("apply", "") == "forward") j["apply"] = "now";
    return j;
  };
  nlohmann::json now = same_order(state_json());
  now["rounds"] = saved.value("rounds", nlohmann::json());
  now["digest"] = saved.value("digest", nlohmann::json());
  return same_order(saved) == now && now["rounds"].is_number_integer() && now["digest"].is_number_integer();
}

void SlimSync::resume_from(const nlohmann::json& saved, bool exact) {
  if (exact)
    resumed(saved.at("rounds").get<int64_t>(), saved.at("digest").get<int64_t>());
  else
    restart();
}

}  // namespace slimshard
