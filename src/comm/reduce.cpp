// reduce.cpp — the elementwise sum used by the shared-memory collectives and the MPI bf16 reduction.
// Accumulates block by block in a small local buffer (float for fp32/bf16, double for fp64), inputs in a
// fixed order, so the result is deterministic and identical on every rank.
#include <c10/util/BFloat16.h>

#include <algorithm>

#include "backend.h"
#include "slimshard/common.h"

namespace slimshard::comm {
namespace {

template <class T, class Acc>
void reduce_typed(T* out, const void* const* in, int k, int64_t n, double scale) {
  constexpr int64_t kBlock = 1024;
  Acc acc[kBlock];
  const Acc s = static_cast<Acc>(scale);
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int64_t m = std::min(kBlock, n - i0);
    const T* a = static_cast<const T*>(in[0]) + i0;
    for (int64_t j = 0; j < m; ++j) acc[j] = static_cast<Acc>(a[j]);
    for (int q = 1; q < k; ++q) {
      const T* b = static_cast<const T*>(in[q]) + i0;
      for (int64_t j = 0; j < m; ++j) acc[j] += static_cast<Acc>(b[j]);
    }
    if (scale != 1.0)
      for (int64_t j = 0; j < m; ++j) acc[j] *= s;
    T* o = out + i0;
    for (int64_t j = 0; j < m; ++j) o[j] = static_cast<T>(acc[j]);
  }
}

}  // namespace

void reduce_into(void* out, const void* const* in, int k, int64_t n, at::ScalarType dtype, double scale) {
  switch (dtype) {
    case at::kFloat:
      return reduce_typed<float, float>(static_cast<float*>(out), in, k, n, scale);
    case at::kDouble:
      return reduce_typed<double, double>(static_cast<double*>(out), in, k, n, scale);
    case at::kBFloat16:
      return reduce_typed<c10::BFloat16, float>(static_cast<c10::BFloat16*>(out), in, k, n, scale);
    case at::kLong:
      if (scale != 1.0) throw RuntimeError("average of an int64 tensor is not supported");
      return reduce_typed<int64_t, int64_t>(static_cast<int64_t*>(out), in, k, n, 1.0);
    default:
      throw RuntimeError(std::string("collective reduction of dtype ") + c10::toString(dtype) +
                         " is not supported");
  }
}

}  // namespace slimshard::comm
