// mpi_backend.cpp — collectives as plain MPI calls: the reference the shared-memory path is tested against,
// and the path between nodes. bf16 has no MPI type: it travels as 16-bit words with a user-defined sum.
#include <climits>

#include "backend.h"
#include "slimshard/common.h"

namespace slimshard::comm {
namespace {

void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const void* inputs[2] = {inout, in};
  reduce_into(inout, inputs, 2, *len, at::kBFloat16, 1.0);
}

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw RuntimeError(std::string(what) + " failed: " + std::string(msg, static_cast<size_t>(len)));
  }
}

int as_count(int64_t n, const char* what) {
  if (n > INT_MAX) throw RuntimeError(std::string(what) + ": more than 2^31 elements in one collective");
  return static_cast<int>(n);
}

class MpiBackend final : public Backend {
 public:
  explicit MpiBackend(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_size(comm_, &world_);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Op_create(&bf16_sum, /*commute=*/1, &bf16_sum_op_);
  }
  ~MpiBackend() override { MPI_Op_free(&bf16_sum_op_); }
  std::string name() const override { return "mpi"; }

  void all_reduce(const at::Tensor& t, ReduceOp op) override {
    auto [type, sum] = reduction(t.scalar_type());
    check(MPI_Allreduce(MPI_IN_PLACE, t.data_ptr(), as_count(t.numel(), "all_reduce"), type, sum, comm_),
          "MPI_Allreduce");
    if (op == ReduceOp::avg) t.div_(world_);
  }
  void all_gather(const at::Tensor& out, const at::Tensor& in) override {
    const int n = as_count(in.nbytes(), "all_gather");
    // MPI forbids aliasing send and receive buffers; a rank's own slot of `out` goes as MPI_IN_PLACE.
    const bool in_place =
        in.data_ptr() == static_cast<char*>(out.data_ptr()) + static_cast<int64_t>(rank_) * n;
    check(MPI_Allgather(in_place ? MPI_IN_PLACE : in.data_ptr(), n, MPI_BYTE, out.data_ptr(), n, MPI_BYTE,
                        comm_),
          "MPI_Allgather");
  }
  void reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op) override {
    auto [type, sum] = reduction(in.scalar_type());
    check(MPI_Reduce_scatter_block(in.data_ptr(), out.data_ptr(), as_count(out.numel(), "reduce_scatter"),
                                   type, sum, comm_),
          "MPI_Reduce_scatter_block");
    if (op == ReduceOp::avg) out.div_(world_);
  }
  void broadcast(const at::Tensor& t, int root) override {
    check(MPI_Bcast(t.data_ptr(), as_count(t.nbytes(), "broadcast"), MPI_BYTE, root, comm_), "MPI_Bcast");
  }
  void barrier() override { check(MPI_Barrier(comm_), "MPI_Barrier"); }

 private:
  std::pair<MPI_Datatype, MPI_Op> reduction(at::ScalarType t) const {
    switch (t) {
      case at::kFloat:
        return {MPI_FLOAT, MPI_SUM};
      case at::kDouble:
        return {MPI_DOUBLE, MPI_SUM};
      case at::kLong:
        return {MPI_INT64_T, MPI_SUM};
      case at::kBFloat16:
        return {MPI_UINT16_T, bf16_sum_op_};
      default:
        throw RuntimeError(std::string("MPI reduction of dtype ") + c10::toString(t) + " is not supported");
    }
  }
  MPI_Comm comm_;
  int world_ = 1, rank_ = 0;
  MPI_Op bf16_sum_op_;
};

}  // namespace

std::unique_ptr<Backend> make_mpi_backend(MPI_Comm comm) { return std::make_unique<MpiBackend>(comm); }

}  // namespace slimshard::comm
