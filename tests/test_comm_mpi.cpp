// test_comm_mpi.cpp — the collectives, run under `mpirun -n 2` and `-n 4` on one host and on clusters of 2
// hosts (see tests/CMakeLists.txt), with the backend named by SLIMSHARD_TEST_BACKEND (shm, mpi or hier).
// Every rank draws every rank's input from a seed, so each can compute the expected result sequentially and
// compare; the reductions are also compared with plain MPI's own (called from this thread: MPI runs
// multi-threaded). Odd sizes, sizes the world does not divide, fp32, bf16 and fp64, sum and average.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <mpi.h>

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

// Odd sizes, none divisible by 4 ranks but 1000; the last spans several staging chunks.
const std::vector<int64_t> kSizes = {1, 7, 1000, 65537, 700001};
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

// The reductions against plain MPI's (MPI_Allreduce, MPI_Reduce_scatter_block on MPI_COMM_WORLD): the same
// sums in another order, so within 1e-6 relative (fp32) and 1e-12 (fp64); all-gathers move bytes, so equal.
TEST(Collectives, MatchPlainMpi) {
  const int W = g_comm->world();
  int salt = 400;
  for (auto dtype : {at::kFloat, at::kDouble})
    for (int64_t n : kSizes) {
      ++salt;
      const MPI_Datatype type = dtype == at::kFloat ? MPI_FLOAT : MPI_DOUBLE;
      const double tol = dtype == at::kFloat ? 1e-6 : 1e-12;
      at::Tensor mine = input(g_comm->rank(), n, dtype, salt), ref = mine.clone();
      g_comm->all_reduce(mine)->wait();
      MPI_Allreduce(MPI_IN_PLACE, ref.data_ptr(), static_cast<int>(n), type, MPI_SUM, MPI_COMM_WORLD);
      const double scale = std::max(1.0, ref.abs().max().item<double>());
      EXPECT_LE((mine - ref).abs().max().item<double>(), tol * scale) << "all_reduce n=" << n << " " << dtype;
      at::Tensor in = input(g_comm->rank(), n * W, dtype, salt), out = at::empty({n}, dtype);
      at::Tensor ref_out = at::empty({n}, dtype);
      g_comm->reduce_scatter(out, in)->wait();
      MPI_Reduce_scatter_block(in.data_ptr(), ref_out.data_ptr(), static_cast<int>(n), type, MPI_SUM,
                               MPI_COMM_WORLD);
      EXPECT_LE((out - ref_out).abs().max().item<double>(), tol * scale) << "reduce_scatter n=" << n;
      at::Tensor gathered = at::empty({n * W}, dtype), ref_gathered = at::empty({n * W}, dtype);
      g_comm->all_gather(gathered, mine)->wait();
      MPI_Allgather(mine.data_ptr(), static_cast<int>(n), type, ref_gathered.data_ptr(), static_cast<int>(n),
                    type, MPI_COMM_WORLD);
      EXPECT_TRUE(at::equal(gathered, ref_gathered)) << "all_gather n=" << n;
    }
}

// Bytes per link: a flat ring over W ranks (shm, mpi) — between hosts when this rank's successor is on
// another host; hierarchical — rings over the R ranks of the host, and over the H hosts on 1/R of the bytes.
TEST(Collectives, ByteCountersFollowTheRingConvention) {
  const int W = g_comm->world();
  const Topology& t = g_comm->topology();
  EXPECT_EQ(t.hosts * t.local_size, W);
  const bool hier = g_comm->backend_name() == "hier";
  const int R = t.local_size, H = t.hosts;
  const bool crosses = t.host_of[static_cast<size_t>((g_comm->rank() + 1) % W)] != t.host;
  const int64_t n = 4096 * R * W;  // bytes of the full tensor; every share below is whole
  auto delta = [&](Collective c, Link l, const std::function<void()>& f) {
    const int64_t before = g_comm->bytes(c, l);
    f();
    return g_comm->bytes(c, l) - before;
  };
  auto reduce = [&] { g_comm->all_reduce(at::zeros({n / 4}))->wait(); };
  auto gather = [&] { g_comm->all_gather(at::empty({n / 4}), at::zeros({n / 4 / W}))->wait(); };
  if (hier) {
    EXPECT_EQ(delta(Collective::all_reduce, Link::intra, reduce), 2 * (R - 1) * n / R);
    EXPECT_EQ(delta(Collective::all_reduce, Link::inter, reduce), 2 * (H - 1) * (n / R) / H);
    EXPECT_EQ(delta(Collective::all_gather, Link::intra, gather), (R - 1) * n / R);
    EXPECT_EQ(delta(Collective::all_gather, Link::inter, gather), (H - 1) * (n / R) / H);
  } else {
    EXPECT_EQ(delta(Collective::all_reduce, crosses ? Link::inter : Link::intra, reduce),
              2 * (W - 1) * n / W);
    EXPECT_EQ(delta(Collective::all_reduce, crosses ? Link::intra : Link::inter, reduce), 0);
    EXPECT_EQ(delta(Collective::all_gather, crosses ? Link::inter : Link::intra, gather), (W - 1) * n / W);
  }
  if (H == 1) {
    EXPECT_EQ(g_comm->total_bytes(Link::inter), 0);
  }
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
    std::printf("collectives on %d ranks, %d host(s), %s backend\n", comm->world(), comm->topology().hosts,
                comm->backend_name().c_str());
  }
  int rc = RUN_ALL_TESTS();
  comm.reset();
  return rc;
}
