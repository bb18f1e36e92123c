// Deterministic random numbers. Rng: xoshiro256** seeded through splitmix64, for sequential use.
// counter_uniform/counter_normal: stateless, value i of stream (seed, stream) — so a tensor's
// weights can be generated in any order, in parallel, streamed to disk, and come out identical
// in every dtype and format.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

namespace fathom {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// FNV-1a 64 of a name, for deriving per-tensor streams.
inline uint64_t hash_name(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t x = seed;
    for (auto& s : s_) s = x = splitmix64(x);
  }
  uint64_t next_u64() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // [0, 1) with 53 bits
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  float uniform_f(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(uniform()); }
  // [0, n)
  uint64_t below(uint64_t n) { return n ? next_u64() % n : 0; }
  double normal() {
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

// Uniform in [-1, 1) for element i of stream (seed, stream).
inline float counter_uniform(uint64_t seed, uint64_t stream, uint64_t i) {
  uint64_t h = splitmix64(seed ^ splitmix64(stream ^ splitmix64(i)));
  return static_cast<float>(static_cast<double>(h >> 11) * 0x1.0p-52 - 1.0);
}

}  // namespace fathom
