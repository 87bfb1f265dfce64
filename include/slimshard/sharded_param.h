// sharded_param.h — ShardedParam: every learnable tensor of a model lives in one. It knows its logical name
// and shape, its strategy, the slice of the flattened tensor this rank owns, its fp32 master and optimizer
// state, and how to materialize() the full tensor for an op and release() it afterwards. Also the strategies
// and the predicates every other module asks of them (one definition of "replicated", "sharded", ...).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace slimshard {

class ShardedParam;
class Work;  // comm.h

// slim: replicated like ddp, but gradients stay local; Slim-DP (src/slim) synchronises the weights lightly.
// hsdp / hsdp2: hybrid sharding (PyTorch's HYBRID_SHARD, ZeRO++'s hpZ): zero3 / zero2 among the ranks of one
// host, replicated across hosts — the owned gradient slice all-reduced among the ranks of the same local
// index.
enum class Strategy { ddp, zero1, zero2, zero3, slim, hsdp, hsdp2 };
const char* strategy_name(Strategy s);
// Throws UsageError naming `what` for anything but ddp|zero1|zero2|zero3|slim|hsdp|hsdp2.
Strategy parse_strategy(const std::string& s, const std::string& what);

// Every rank holds the whole param, its whole gradient and optimizer state, and steps all of it (ddp, slim).
constexpr bool is_replicated(Strategy s) { return s == Strategy::ddp || s == Strategy::slim; }
// The optimizer state and the owned gradient are a slice (zero1, zero2, zero3: 1/N; hsdp, hsdp2: 1/R).
constexpr bool is_sharded(Strategy s) { return !is_replicated(s); }
// Sharded among the R ranks of the host, not all N (hsdp, hsdp2).
constexpr bool shards_within_host(Strategy s) { return s == Strategy::hsdp || s == Strategy::hsdp2; }
// The full gradient lives only until it is reduce-scattered, every micro-batch (zero2, zero3, hsdp, hsdp2).
constexpr bool frees_full_grad(Strategy s) {
  return s == Strategy::zero2 || s == Strategy::zero3 || shards_within_host(s);
}
// The full param exists only between materialize() and release() (zero3, hsdp).
constexpr bool gathers_on_use(Strategy s) { return s == Strategy::zero3 || s == Strategy::hsdp; }
// Fusion (DataParallel, Options::fuse_bytes): a sharded param piece whose fp32 master is at most fuse_bytes
// travels with its block's fused group. The engine, the memory simulation and the cost model all ask here.
constexpr bool fits_fused_group(int64_t piece_numel, int64_t fuse_bytes) {
  return fuse_bytes > 0 && 4 * piece_numel <= fuse_bytes;
}
// With its strategy, the fused group a param or op falls in: its block ("blocks.3" for the param
// "blocks.3.attn.qkv.bias" and the op "blocks.3.attn.qkv"), else its op ("ln_f" for "ln_f.bias" and "ln_f").
std::string fusion_block(const std::string& name);
// The full param stays resident and is all-gathered from the updated slices after each step (zero1, zero2,
// hsdp2).
constexpr bool gathers_after_step(Strategy s) {
  return s == Strategy::zero1 || s == Strategy::zero2 || s == Strategy::hsdp2;
}
// The ranks a param under `s` is sharded over: all `world`, or (hybrid) the `per_host` of its host (0: one
// host, all of them).
constexpr int shard_ranks(Strategy s, int world, int per_host) {
  return shards_within_host(s) && per_host > 0 ? per_host : world;
}

// The floating-point formats of a run, as FSDP's MixedPrecision: the fp32 master and optimizer state stay on
// the rank that owns them; forward and backward use a working copy in `compute` (gathered in that dtype), and
// gradients travel in `reduce` (accumulated over micro-batches in fp32 whatever it is).
struct Precision {
  at::ScalarType compute = at::kFloat;
  at::ScalarType reduce = at::kFloat;
  bool operator==(const Precision& o) const { return compute == o.compute && reduce == o.reduce; }
  bool operator!=(const Precision& o) const { return !(*this == o); }
  int compute_bytes() const { return compute == at::kBFloat16 ? 2 : 4; }
  int reduce_bytes() const { return reduce == at::kBFloat16 ? 2 : 4; }
  std::string name() const;  // "fp32", "bf16" or "bf16 (fp32 reduce)"-style, for messages
};
// "fp32" | "bf16" (what --precision and --reduce-dtype take); anything else is a UsageError naming `what`.
at::ScalarType parse_float_type(const std::string& s, const std::string& what);
const char* float_type_name(at::ScalarType t);

// Elements of a tensor of `numel` padded to a multiple of `world` (how sharded params are laid out).
constexpr int64_t padded_numel(int64_t numel, int world) { return (numel + world - 1) / world * world; }
// Elements of a tensor of `numel` this rank owns and steps under `s`: all of it, or its slice of the
// `ranks` it is sharded over (shard_ranks()).
constexpr int64_t owned_numel(Strategy s, int64_t numel, int ranks) {
  return is_replicated(s) ? numel : padded_numel(numel, ranks) / ranks;
}

// Where a zero3 param's full value comes from when an op materializes it: the Prefetcher (gathers K ahead).
class ParamGatherer {
 public:
  virtual ~ParamGatherer() = default;
  // A padded flat buffer holding the full value (all ranks' shards gathered).
  virtual at::Tensor acquire(ShardedParam& p) = 0;
  virtual void release(ShardedParam& p) = 0;
};

// A block's recomputed forward and the backward after it (nn.h): from construction until stop_keeping(), a
// param gathered on use keeps its gathered value past release(); the backward's materialize() takes it
// without gathering again and its release() drops it. What the backward does not use again (a Linear's bias:
// its gradient needs no weight) is dropped when this ends.
class KeptGathers {
 public:
  KeptGathers();
  ~KeptGathers();
  KeptGathers(const KeptGathers&) = delete;
  KeptGathers& operator=(const KeptGathers&) = delete;
  void stop_keeping();
  // Whether one is keeping on this thread (a recomputed forward is running).
  static bool keeping();

 private:
  std::vector<ShardedParam*> kept_;
  KeptGathers* outer_;
  friend class ShardedParam;
};

class ShardedParam {
 public:
  // `init` is the full initial value, identical on every rank (models draw it from the shared seed).
  // `decay`: whether weight decay applies (matrices yes; biases, norms no).
  ShardedParam(std::string name, const at::Tensor& init, bool decay);

  const std::string& name() const { return name_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const { return numel_; }
  bool decay() const { return decay_; }
  Strategy strategy() const { return strategy_; }

  // Lays the storage out for `s` as rank `rank` of `world`, from the full value held now (the same on every
  // rank). Sharded strategies flatten and pad to a multiple of `world`; rank r owns [r·S, (r+1)·S).
  //   ddp   full param, full grad (in a bucket), full optimizer state
  //   zero1 full param, full grad, 1/N grad shard and optimizer state
  //   zero2 full param, 1/N grad (the full grad exists only until reduce-scattered), 1/N optimizer state
  //   zero3 1/N param, 1/N grad, 1/N optimizer state; the full param only between materialize() and release()
  //   slim  as ddp, the gradient in its own storage (never reduced)
  // With a `compute` dtype other than the master's (bf16), the master and its optimizer state are the owned
  // slice alone, and what ops use is a working copy in `compute`: ddp/slim a full copy, zero1/zero2 the full
  // param (gathered after each step), zero3 a copy of the shard (what is gathered). Gradients stay fp32.
  void shard(Strategy s, int rank, int world, at::ScalarType compute = at::kFloat);
  // The dtype ops compute in: the working copy's.
  at::ScalarType compute_dtype() const { return compute_; }
  // True when the working copy is not the master (mixed precision).
  bool mixed() const { return compute_ != master_.scalar_type(); }
  int64_t padded_numel() const { return padded_; }
  int64_t shard_numel() const { return shard_numel_; }
  int64_t shard_offset() const { return shard_offset_; }
  void set_gatherer(ParamGatherer* g) { gatherer_ = g; }

  // The full tensor in its logical shape, ready for compute (zero3: gathered, possibly prefetched).
  at::Tensor materialize();
  // Done with the full tensor until the next materialize() (zero3: the gathered buffer is dropped).
  void release();

  // Full-shaped buffer the op accumulates this param's gradient into (addmm_, index_add_, add_); zero2/zero3
  // allocate it on first use in a micro-batch.
  at::Tensor grad_buffer();
  // The op finished writing this micro-batch's gradient: the hook (set by the data-parallel engine) may start
  // its reduction now, while backward goes on.
  void grad_ready();
  void set_grad_ready_hook(std::function<void(ShardedParam&)> hook) { on_grad_ready_ = std::move(hook); }
  // zero1: the persistent padded full gradient. zero2/zero3: the one just produced, handed over (the param
  // keeps no reference, so it is freed once reduce-scattered).
  at::Tensor full_grad_flat();
  at::Tensor take_full_grad_flat();

  // The flat fp32 slice this rank owns and updates, its gradient, and its optimizer state.
  at::Tensor master() const { return master_; }
  at::Tensor grad() const { return grad_; }
  std::map<std::string, at::Tensor>& optim_state() { return optim_state_; }
  void zero_grad();
  // zero1/zero2: the padded flat full param (the working copy); owned_working() is this rank's slice of it,
  // all-gathered in place after a step (in fp32 the same storage as master()).
  at::Tensor flat_param() { return flat_; }
  at::Tensor owned_working() { return flat_.slice(0, shard_offset_, shard_offset_ + shard_numel_); }
  // zero3: what this rank contributes to a gather (the working copy of its shard).
  at::Tensor gather_source() const { return work_shard_.defined() ? work_shard_ : master_; }
  // zero1/zero2/hsdp2: the all-gather of the updated slices, left running into the next forward
  // (DataParallel::after_optimizer_step): whatever reads the full param first waits for it — materialize(),
  // replicated_value(), full_value() — so the gathers cross the link while the forward before it computes.
  // Slim-DP's rounds applied per block (--slim-apply forward) are held here too, for the same waits.
  void set_pending_gather(std::shared_ptr<Work> w) { pending_gather_ = std::move(w); }
  void wait_gather() const;
  bool gather_pending() const { return pending_gather_ != nullptr; }
  // After the masters changed (an optimizer step, a loaded checkpoint, a Slim-DP round): the working copy
  // takes their value. zero1/zero2: this rank's slice only (the caller all-gathers the rest). No-op when the
  // working copy is the master.
  void refresh_working();
  // Mixed precision: the part of the working copy that mirrors master() element for element (ddp: the full
  // copy; zero3/hsdp: the shard's; zero1/zero2/hsdp2: this rank's slice of the full param), for an optimizer
  // that writes it in the pass that updates the masters and then calls working_written(): the next
  // refresh_working() has nothing to copy. Undefined in fp32, and for slim (its round moves the masters after
  // the optimizer).
  at::Tensor working_of_master();
  void working_written() { working_written_ = true; }
  // The optimizer zeroed grad() in its pass: the next zero_grad() need not.
  void grad_zeroed() { grad_zeroed_ = true; }
  // The full param as every rank holds it (ddp/slim: the master; zero1/zero2: the full working param), for
  // checksums of whether ranks agree; undefined for zero3 (sharded).
  at::Tensor replicated_value() const;

  // The full current master value (a copy); for replicated params, and zero1/zero2 in fp32 (otherwise the
  // masters are shards: see DataParallel::full_values).
  at::Tensor full_value();
  // Whether full_value() can answer without a gather.
  bool has_full_master() const {
    return is_replicated(strategy_) || (gathers_after_step(strategy_) && !mixed());
  }
  // Overwrites the value (full, logical shape), e.g. from a saved model; before shard() only. A different
  // floating dtype re-lays the storage in that dtype (tests run ops in double).
  void set_value(const at::Tensor& full);

  // Bytes this rank holds persistently for this param (params + grads + optimizer state).
  int64_t resident_bytes() const;
  // ddp: makes the gradient live in `flat` (numel() elements, a slice of a bucket), zeroed.
  void set_grad_storage(const at::Tensor& flat);
  // ddp/slim: moves the value into `flat` (numel() elements, e.g. a slice of one buffer for many params), so
  // that work over many params is one op over that buffer. Before the optimizer state exists.
  void set_value_storage(const at::Tensor& flat);

 private:
  std::string name_;
  std::vector<int64_t> shape_;
  int64_t numel_;
  bool decay_;
  Strategy strategy_ = Strategy::ddp;
  int64_t padded_ = 0, shard_numel_ = 0, shard_offset_ = 0;
  at::ScalarType compute_ = at::kFloat;
  at::Tensor flat_;        // the full param, flat (padded when sharded); zero1/2 mixed: the working copy
  at::Tensor full_;        // logical-shape view of flat_
  at::Tensor work_full_;   // ddp/slim mixed: the working copy, logical shape
  at::Tensor work_shard_;  // zero3 mixed: the working copy of the owned shard
  at::Tensor master_;      // owned slice (ddp: all of flat_; zero1/2: a view into flat_ in fp32, own storage
                           // when mixed; zero3: own storage)
  at::Tensor grad_flat_;   // the full gradient, flat (padded when sharded)
  at::Tensor grad_full_;   // logical-shape view of grad_flat_
  at::Tensor grad_;        // owned gradient slice (ddp: the bucket view; zero: own storage)
  std::map<std::string, at::Tensor> optim_state_;
  bool working_written_ = false, grad_zeroed_ = false;  // by the optimizer's pass (above)
  std::function<void(ShardedParam&)> on_grad_ready_;
  ParamGatherer* gatherer_ = nullptr;
  at::Tensor kept_;  // gathered in a recomputed forward, for the backward after it (KeptGathers)
  mutable std::shared_ptr<Work> pending_gather_;  // set_pending_gather()
  friend class KeptGathers;
};

// dst += src, into an fp32 gradient: with a bf16 src (a weight-gradient GEMM's output, a slice off a bf16
// wire) without the fp32 copy of all of src that LibTorch's CPU add_ of mixed dtypes makes first (4 bytes per
// element more at backward's peak, or on the comm thread at a moment no estimate can know); each sum is the
// same fp32 addition. Other dtypes: add_.
void add_widening(const at::Tensor& dst, const at::Tensor& src);

}  // namespace slimshard
