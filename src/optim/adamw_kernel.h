// adamw_kernel.h — AdamW's update over raw fp32 arrays in one pass (adamw_kernel.cpp). Private to src/optim.
#pragma once
#include <cstdint>

namespace slimshard {

// For each i: m = β1·m + (1−β1)·g; v = β2·v + (1−β2)·g²; w = keep·w + step·m / (√v / √bc2 + ε) — the same
// arithmetic, in the same order, as torch.optim.AdamW's op-by-op form (keep = 1 − lr·wd, step = −lr / bc1).
struct AdamWScalars {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, keep, step, sqrt_bc2, eps;
};
void adamw_update(float* w, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s);

}  // namespace slimshard
