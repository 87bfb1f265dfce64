// backend.h — how the comm thread moves bytes: plain MPI collectives, or an MPI-3 shared-memory window on one
// node. Private to src/comm; only the comm thread calls a Backend.
#pragma once
#include <ATen/core/Tensor.h>
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "slimshard/comm.h"

namespace slimshard::comm {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual void all_reduce(const at::Tensor& t, ReduceOp op) = 0;
  virtual void all_gather(const at::Tensor& out, const at::Tensor& in) = 0;
  virtual void reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op) = 0;
  virtual void broadcast(const at::Tensor& t, int root) = 0;
  virtual void barrier() = 0;
  // What a blocked collective is waiting for, when the backend can tell ("rank 1, last at step 12"); read by
  // the watchdog thread, so it must be safe to call concurrently.
  virtual std::string waiting_on() const { return {}; }
  // This rank's current step, visible to the other ranks for their watchdog messages.
  virtual void publish_step(int64_t) {}
  // Bytes of staging memory held, for the buffer report.
  virtual int64_t buffer_bytes() const { return 0; }
};

std::unique_ptr<Backend> make_mpi_backend(MPI_Comm comm);
// One host only: every rank of `comm` must share memory with every other. `labels` name its ranks in
// watchdog messages ("rank 3 on host b"; default "rank q").
std::unique_ptr<Backend> make_shm_backend(MPI_Comm comm, int64_t bytes_per_rank,
                                          std::vector<std::string> labels = {});
// Across hosts with the same number of ranks each (hier_backend.cpp): within a host through `intra` (the
// host's shared-memory window), between hosts through `across` (MPI among the ranks of the same local index).
// Both outlive it.
std::unique_ptr<Backend> make_hier_backend(MPI_Comm comm, const Topology& topology, Backend* intra,
                                           Backend* across);
// "rank g on host NAME" for each rank of `t` sharing a host with `rank`, in local order (for the shm
// backend).
std::vector<std::string> rank_labels(const Topology& t, int rank);

// Elementwise reduction of `n` elements of `dtype` from `in[0..k)` into `out` (which may alias an input), in
// the order given, so that every rank that reduces the same inputs gets the same bits. Scales by `scale`
// (avg).
void reduce_into(void* out, const void* const* in, int k, int64_t n, at::ScalarType dtype, double scale);

}  // namespace slimshard::comm
