// test_gathers_mpi.cpp — DataParallel's all-gathers after a step (zero1, zero2, hsdp2; alone and fused per
// block), which it leaves in flight into the next forward, under mpirun (in comm_tests): what an op's first
// materialize() returns, and what every param holds once the next backward ends (the params no forward used),
// is the whole update — each rank's slice as that rank wrote it — in the deferred and in the eager order, in
// fp32 and bf16. Every rank computes every slice's value, so each checks the result against that oracle.
#include <gtest/gtest.h>

#include <memory>

#include "slimshard/comm.h"
#include "slimshard/data_parallel.h"
#include "slimshard/sharded_param.h"

using namespace slimshard;

extern Communicator* g_comm;

namespace {

// Three blocks, one strategy each; in each a large param gathered alone and small ones fused.
struct Spec {
  std::string name;
  std::vector<int64_t> shape;
  Strategy strategy;
};
const std::vector<Spec> kSpecs = {
    {"blocks.0.fc.weight", {512, 700}, Strategy::zero2}, {"blocks.0.fc.bias", {1000}, Strategy::zero2},
    {"blocks.0.ln.weight", {33}, Strategy::zero2},       {"blocks.1.fc.weight", {300, 301}, Strategy::zero1},
    {"blocks.1.fc.bias", {7}, Strategy::zero1},          {"blocks.1.ln.bias", {65}, Strategy::zero1},
    {"blocks.2.fc.weight", {700001}, Strategy::hsdp2},   {"blocks.2.fc.bias", {64}, Strategy::hsdp2},
    {"blocks.2.ln.weight", {513}, Strategy::hsdp2}};

// The value every rank's optimizer step leaves in param i, flat and padded (`round` makes each step's new).
at::Tensor updated(size_t i, int64_t padded, int round) {
  at::manual_seed(static_cast<uint64_t>(1000 * round + i));
  return at::randn({padded});
}

void check_deferred_gathers(bool defer, at::ScalarType compute) {
  std::vector<std::unique_ptr<ShardedParam>> owned;
  std::vector<ShardedParam*> params;
  std::vector<Strategy> strategies;
  at::manual_seed(3);
  for (const Spec& s : kSpecs) {
    owned.push_back(std::make_unique<ShardedParam>(s.name, at::randn(s.shape), true));
    params.push_back(owned.back().get());
    strategies.push_back(s.strategy);
  }
  DataParallel::Options o;
  o.precision.compute = compute;
  o.defer_gathers = defer;
  DataParallel dp(*g_comm, params, strategies, o);
  ASSERT_EQ(dp.fusion_groups().size(), 3u);
  const std::string what = std::string(defer ? "deferred" : "eager") + ", " + float_type_name(compute);
  auto step = [&](int round) {  // the optimizer's part: each rank writes its own slice of the masters
    for (size_t i = 0; i < params.size(); ++i) {
      ShardedParam& p = *params[i];
      p.master().copy_(updated(i, p.padded_numel(), round).narrow(0, p.shard_offset(), p.shard_numel()));
    }
    dp.after_optimizer_step();
  };
  auto want = [&](size_t i, int round) {
    return updated(i, params[i]->padded_numel(), round).slice(0, 0, params[i]->numel()).to(compute);
  };
  // The next forward's ops, the last-issued gathers first (the least likely to have finished).
  step(1);
  for (size_t i = params.size(); i-- > 0;) {
    const at::Tensor full = params[i]->materialize().reshape({-1});
    EXPECT_TRUE(at::equal(full, want(i, 1))) << params[i]->name() << ", " << what;
    params[i]->release();
  }
  // A step whose forward used none of them: the backward's end waits for every gather still in flight.
  step(2);
  dp.begin_backward(0, 1);
  dp.end_backward(true);
  for (size_t i = params.size(); i-- > 0;)
    EXPECT_TRUE(at::equal(params[i]->flat_param().slice(0, 0, params[i]->numel()), want(i, 2)))
        << params[i]->name() << " after the backward, " << what;
}

}  // namespace

TEST(DeferredGathers, FirstUseAndBackwardEndSeeTheWholeUpdate) {
  for (bool defer : {true, false})
    for (at::ScalarType compute : {at::kFloat, at::kBFloat16}) check_deferred_gathers(defer, compute);
}
