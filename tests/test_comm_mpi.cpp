// test_comm_mpi.cpp — the collectives, run under `mpirun -n 2` and `-n 4` (see tests/CMakeLists.txt), with
// the backend named by SLIMSHARD_TEST_BACKEND (shm or mpi). Every rank draws every rank's input from a seed,
// so each can compute the expected result sequentially and compare. Odd sizes, fp32, bf16 and fp64, sum and
// average.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "slimshard/comm.h"
#include "slimshard/memory.h"

using namespace slimshard;

Communicator* g_comm = nullptr;  // also used by test_slim_mpi.cpp

namespace {

at::Tensor input(int rank, int64_t n, at::ScalarType dtype, int salt) {
  at::manual_seed(1000 * salt + rank);
  return at::randn({n}, at::kDouble).to(dtype);
}

// Sum in rank order, in double, then rounded to dtype: what the reduction should give within rounding.
at::Tensor expected_sum(int64_t n, at::ScalarType dtype, int salt, bool avg) {
  at::Tensor acc = at::zeros({n}, at::kDouble);
  for (int r = 0; r < g_comm->world(); ++r) acc += input(r, n, dtype, salt).to(at::kDouble);
  if (avg) acc /= g_comm->world();
  return acc;
}

double tolerance(at::ScalarType dtype) {
  return dtype == at::kBFloat16 ? 3e-2 : dtype == at::kFloat ? 1e-5 : 1e-12;
}

void expect_close(const at::Tensor& got, const at::Tensor& want, at::ScalarType dtype,
                  const std::string& what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  const double err = (got.to(at::kDouble) - want).abs().max().item<double>();
  EXPECT_LE(err, tolerance(dtype) * std::max(1.0, want.abs().max().item<double>())) << what;
}

const std::vector<int64_t> kSizes = {1, 7, 1000, 65537, 700001};  // the last spans several staging chunks
const std::vector<at::ScalarType> kTypes = {at::kFloat, at::kBFloat16, at::kDouble};

}  // namespace

TEST(Collectives, AllReduceSumAndAverage) {
  int salt = 0;
  for (auto dtype : kTypes)
    for (int64_t n : kSizes)
      for (bool avg : {false, true}) {
        ++salt;
        at::Tensor t = input(g_comm->rank(), n, dtype, salt);
        g_comm->all_reduce(t, avg ? ReduceOp::avg : ReduceOp::sum)->wait();
        expect_close(
            t, expected_sum(n, dtype, salt, avg), dtype,
            "all_reduce n=" + std::to_string(n) + " " + c10::toString(dtype) + (avg ? " avg" : " sum"));
      }
}

TEST(Collectives, AllReduceIsBitIdenticalOnEveryRank) {
  at::Tensor t = input(g_comm->rank(), 100003, at::kFloat, 77);
  g_comm->all_reduce(t)->wait();
  at::Tensor all = at::empty({g_comm->world() * t.numel()}, at::kFloat);
  g_comm->all_gather(all, t)->wait();
  for (int r = 1; r < g_comm->world(); ++r) EXPECT_TRUE(at::equal(all.chunk(g_comm->world())[r], t)) << r;
}

TEST(Collectives, AllGather) {
  int salt = 100;
  for (auto dtype : kTypes)
    for (int64_t n : kSizes) {
      ++salt;
      at::Tensor in = input(g_comm->rank(), n, dtype, salt);
      at::Tensor out = at::empty({n * g_comm->world()}, dtype);
      g_comm->all_gather(out, in)->wait();
      for (int r = 0; r < g_comm->world(); ++r)
        EXPECT_TRUE(at::equal(out.slice(0, r * n, (r + 1) * n), input(r, n, dtype, salt)))
            << "all_gather n=" << n << " from rank " << r;
    }
}

TEST(Collectives, ReduceScatter) {
  int salt = 200;
  for (auto dtype : kTypes)
    for (int64_t n : kSizes)
      for (bool avg : {false, true}) {
        ++salt;
        const int64_t total = n * g_comm->world();
        at::Tensor in = input(g_comm->rank(), total, dtype, salt);
        at::Tensor out = at::empty({n}, dtype);
        g_comm->reduce_scatter(out, in, avg ? ReduceOp::avg : ReduceOp::sum)->wait();
        at::Tensor want =
            expected_sum(total, dtype, salt, avg).slice(0, g_comm->rank() * n, (g_comm->rank() + 1) * n);
        expect_close(out, want, dtype, "reduce_scatter n=" + std::to_string(n) + " " + c10::toString(dtype));
      }
}

TEST(Collectives, BroadcastFromEveryRoot) {
  for (int root = 0; root < g_comm->world(); ++root)
    for (int64_t n : kSizes) {
      at::Tensor t = input(g_comm->rank(), n, at::kFloat, 300 + root);
      g_comm->broadcast(t, root)->wait();
      EXPECT_TRUE(at::equal(t, input(root, n, at::kFloat, 300 + root))) << "root " << root << " n=" << n;
    }
}

TEST(Collectives, ManyOutstandingWorksFinishInOrder) {
  std::vector<at::Tensor> ts;
  std::vector<WorkPtr> works;
  for (int i = 0; i < 20; ++i) {
    ts.push_back(at::full({1000 + i}, static_cast<float>(g_comm->rank() + i)));
    works.push_back(g_comm->all_reduce(ts.back()));
  }
  works.push_back(g_comm->barrier());
  for (auto& w : works) w->wait();
  const int W = g_comm->world();
  for (int i = 0; i < 20; ++i)
    EXPECT_FLOAT_EQ(ts[size_t(i)][0].item<float>(), float(W * (W - 1) / 2 + W * i));
}

TEST(Collectives, ByteCountersFollowTheRingConvention) {
  const int W = g_comm->world();
  const int64_t before = g_comm->bytes(Collective::all_reduce);
  g_comm->all_reduce(at::zeros({1024}))->wait();
  EXPECT_EQ(g_comm->bytes(Collective::all_reduce) - before, 2 * (W - 1) * 4096 / W);
  const int64_t ag = g_comm->bytes(Collective::all_gather);
  g_comm->all_gather(at::empty({1024 * W}), at::zeros({1024}))->wait();
  EXPECT_EQ(g_comm->bytes(Collective::all_gather) - ag, (W - 1) * 4096);
}

int main(int argc, char** argv) {
  memory::install();
  at::set_num_threads(1);
  ::testing::InitGoogleTest(&argc, argv);
  CommOptions o;
  const char* backend = std::getenv("SLIMSHARD_TEST_BACKEND");
  o.backend = backend ? backend : "auto";
  o.shm_bytes = 1 << 20;  // small staging, so that large tensors go through many chunks
  o.timeout_s = 60;
  auto comm = Communicator::create(o);
  g_comm = comm.get();
  if (comm->rank() != 0) {  // one report per job
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  } else {
    std::printf("collectives on %d ranks, %s backend\n", comm->world(), comm->backend_name().c_str());
  }
  int rc = RUN_ALL_TESTS();
  comm.reset();
  return rc;
}
