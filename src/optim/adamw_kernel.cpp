// adamw_kernel.cpp — AdamW's update over raw fp32 arrays in one pass (see adamw_kernel.h). Each element's
// gradient, moments and weight are read and written once; LibTorch's op-by-op form makes ten passes, and on
// one core the optimizer is memory-bound (gpt-25m: 55 ms of a 730 ms bf16 step). Built without LibTorch's
// headers and with -fno-math-errno (CMakeLists.txt), so that the square root vectorizes; compiled for
// AVX-512, AVX2 and the baseline, the CPU picking at load time as LibTorch's own kernels do.
#include "adamw_kernel.h"

#include <cmath>
#include <cstring>

namespace slimshard {
namespace {

// fp32 → bf16 bits, rounded to nearest even; NaN stays NaN (c10::BFloat16's conversion).
__attribute__((always_inline)) inline uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return f != f ? uint16_t{0x7fc0} : static_cast<uint16_t>(rounded);
}

// The loop, with the working copy fixed at compile time so that each variant vectorizes on its own.
template <bool kWorking>
__attribute__((always_inline)) inline void update(float* w, float* g, float* m, float* v, int64_t n,
                                                  const AdamWScalars& c, uint16_t* working) {
  for (int64_t i = 0; i < n; ++i) {
    // Separate products and sums, as LibTorch's ops (the file is built without contraction: CMakeLists.txt);
    // its add_ with alpha is a fused multiply-add, not used here: without FMA in every variant the loops do
    // not vectorize. So m, and through it w, can differ from LibTorch's in the last bit.
    const float gi = g[i] * c.grad_scale;
    const float mi = m[i] * c.beta1 + c.one_minus_beta1 * gi;
    const float vi = v[i] * c.beta2 + c.one_minus_beta2 * gi * gi;
    m[i] = mi, v[i] = vi;
    const float wi = w[i] * c.keep + c.step * mi / (std::sqrt(vi) / c.sqrt_bc2 + c.eps);
    w[i] = wi;
    if (kWorking) working[i] = bf16_bits(wi);
    g[i] = 0.0f;
  }
}

}  // namespace

__attribute__((target_clones("avx512f", "avx2", "default"))) void adamw_update(float* w, float* g, float* m,
                                                                               float* v, int64_t n,
                                                                               const AdamWScalars& s,
                                                                               uint16_t* working) {
  const AdamWScalars c = s;  // locals: no aliasing with the arrays
  if (working)
    update<true>(w, g, m, v, n, c, working);
  else
    update<false>(w, g, m, v, n, c, nullptr);
}

}  // namespace slimshard
