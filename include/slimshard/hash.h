// hash.h — the project's two hash functions, one definition each: splitmix64 (Steele et al.) for
// deterministic randomness from (seed, step, row, round), and FNV-1a (64-bit) for digests that ranks compare.
#pragma once
#include <cstddef>
#include <cstdint>

namespace slimshard {

constexpr uint64_t kSplitMixGamma = 0x9E3779B97F4A7C15ull;  // 2^64 / golden ratio
constexpr uint64_t kFnvOffset = 14695981039346656037ull;    // FNV-1a 64-bit offset basis
constexpr uint64_t kFnvPrime = 1099511628211ull;            // FNV-1a 64-bit prime

// splitmix64's output for state `x`: a bijective mix, so distinct inputs never collide.
inline uint64_t mix64(uint64_t x) {
  x += kSplitMixGamma;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The next draw of a splitmix64 stream (advances `state`).
inline uint64_t splitmix64_next(uint64_t& state) {
  const uint64_t out = mix64(state);
  state += kSplitMixGamma;
  return out;
}

// One FNV-1a step over a whole 64-bit value (the digest of a sequence of indices).
inline uint64_t fnv1a(uint64_t h, uint64_t value) { return (h ^ value) * kFnvPrime; }

// FNV-1a over bytes.
inline uint64_t fnv1a_bytes(uint64_t h, const void* data, size_t n) {
  const auto* b = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * kFnvPrime;
  return h;
}

}  // namespace slimshard
