// adamw_kernel.h — AdamW's update over raw fp32 arrays in one pass (adamw_kernel.cpp). Private to src/optim.
#pragma once
#include <cstdint>

namespace slimshard {

// For each i, with g = grad_scale·g (the clipping's factor, 1 without):  m = β1·m + (1−β1)·g;
// v = β2·v + (1−β2)·g²; w = keep·w + step·m / (√v / √bc2 + ε) — the same arithmetic, in the same order, as
// torch.optim.AdamW's op-by-op form in LibTorch, to the last bit (keep = 1 − lr·wd, step = −lr / bc1).
struct AdamWScalars {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, keep, step, sqrt_bc2, eps, grad_scale;
};
// In the same pass: g is left zeroed for the next step and, when given, `working` (bf16 bits) takes the new w
// rounded to nearest even, as LibTorch's fp32 → bf16 copy does (mixed precision's working copy) — each a pass
// over memory of its own otherwise (gpt-25m in bf16: 12 and 16 ms of a 480 ms step on one rank).
void adamw_update(float* w, float* g, float* m, float* v, int64_t n, const AdamWScalars& s,
                  uint16_t* working);

}  // namespace slimshard
