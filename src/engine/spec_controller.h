// SpecController: whether MTP drafting pays at the current batch size, by measurement
// (EngineOptions::speculative_adaptive). Engine thread only.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

namespace fathom {

// EngineOptions::speculative_adaptive: per batch-size bucket (1, 2-3, 4-7, ... decoding
// sequences), an exponential average of the tokens per second of steady steps with drafts (each
// decoding sequence verified one and drafted the next) and of steady steps without (none verified,
// none drafted; the MTP layer's cache entries still written). The faster way is kept; the other is
// tried for kSpecProbeSteps steps (the first of them a transition, unmeasured) after kSpecProbeEvery
// steps, an interval that doubles, up to kSpecProbeEveryMax, each time a probe leaves the choice
// as it was and returns to kSpecProbeEvery when one changes it; a probe's samples restart the
// probed way's average, which is stale by then. A way never measured is tried first, except that
// a bucket where drafting is unmeasured takes plain steps first when the nearest smaller bucket
// that measured both ways found drafting slower (presumed_plain): a larger batch's step is more
// bound by its arithmetic, which drafting adds to (vLLM stops drafting above a batch size,
// `speculative_disable_by_batch_size`), so its first probe, kSpecProbeEvery steps in, measures
// drafting there instead of an exploration at once. On the
// V2-Lite synthetic checkpoint (random MTP weights: no draft is accepted) drafting doubles a
// step's routed experts and adds the MTP head: steps with drafts took 1.3-2.3x as long for the
// same tokens (`bench serve --url`, 1-32 clients, 2026-12-07).
inline constexpr int kSpecBuckets = 10;
inline constexpr int64_t kSpecProbeEvery = 64;
inline constexpr int64_t kSpecProbeEveryMax = 1024;
inline constexpr int64_t kSpecProbeSteps = 3;

class SpecController {
 public:
  static int bucket(int64_t n_seqs) {
    return std::min(
        kSpecBuckets - 1,
        static_cast<int>(std::bit_width(static_cast<uint64_t>(std::max<int64_t>(1, n_seqs)))) - 1);
  }
  // Whether the sequences of a step with `n_seqs` decoding should draft for the next step.
  bool want_drafts(int64_t n_seqs) {
    const int i = bucket(n_seqs);
    Bucket& b = buckets_[i];
    if (b.probe_left > 0) {
      --b.probe_left;
      return !b.best_spec;
    }
    if (b.tps[1] < 0 && !presumed_plain(i)) return true;  // drafting never measured here
    if (b.tps[0] < 0) return false;  // nor plain steps
    const bool best = b.tps[1] > b.tps[0];
    if (best != b.best_spec) {
      b.probe_every = kSpecProbeEvery;
    } else if (b.probed) {
      b.probe_every = std::min(kSpecProbeEveryMax, 2 * b.probe_every);
    }
    b.best_spec = best;
    b.probed = false;
    if (++b.since_probe >= b.probe_every) {
      b.since_probe = 0;
      b.probe_left = kSpecProbeSteps - 1;
      b.probed = true;
      b.fresh[b.best_spec ? 0 : 1] = true;  // the probed way's average is stale: restart it
      return !b.best_spec;
    }
    return b.best_spec;
  }
  // The way want_drafts keeps for `n_seqs` at the moment, without counting a step toward a probe
  // (a step where sequences only finish their prompts).
  bool preferred(int64_t n_seqs) const {
    const int i = bucket(n_seqs);
    const Bucket& b = buckets_[i];
    return (b.tps[1] < 0 && !presumed_plain(i)) || (b.tps[0] >= 0 && b.tps[1] > b.tps[0]);
  }
  // Whether drafting, unmeasured in bucket i, is presumed slower there: the nearest smaller bucket
  // that measured both ways found it so.
  bool presumed_plain(int i) const {
    for (int j = i - 1; j >= 0; --j) {
      const Bucket& s = buckets_[j];
      if (s.tps[0] >= 0 && s.tps[1] >= 0) return s.tps[1] <= s.tps[0];
    }
    return false;
  }
  // A steady step's throughput: `spec` whether its sequences verified and drafted.
  void record(int64_t n_seqs, bool spec, double tokens_per_s) {
    Bucket& b = buckets_[bucket(n_seqs)];
    double& t = b.tps[spec ? 1 : 0];
    t = t < 0 || b.fresh[spec ? 1 : 0] ? tokens_per_s : 0.75 * t + 0.25 * tokens_per_s;
    b.fresh[spec ? 1 : 0] = false;
  }

 private:
  struct Bucket {
    double tps[2] = {-1, -1};  // without drafts, with drafts
    bool best_spec = true;
    bool probed = false;             // a probe ran since the last choice
    bool fresh[2] = {false, false};  // the next sample of a way replaces its average (a probe)
    int64_t since_probe = 0, probe_left = 0, probe_every = kSpecProbeEvery;
  };
  Bucket buckets_[kSpecBuckets];
};

}  // namespace fathom
