// `fathom bench train`: the training path's speed against this machine's fp32 peak, measured in
// the same run (kernels/roofline.h).
//  - GEMMs: the backward's blocked kernels (dX = dY.W, dW += dY^T.X; train/gemm.h) next to the
//    runtime's fp32 matmul (the forward, Y = X.W^T) on the same shapes: GFLOP/s, fraction of the
//    measured f32 FMA peak, and backward/forward ratios.
//  - Step: one whole-model forward + backward (MTP and balance losses included) of a V3-shaped
//    small model on random tokens: tokens/s and model FLOPs utilisation, where model FLOPs =
//    3 x forward (2 per active weight per token for every linear incl. lm_head and MTP, plus
//    causal attention's QK^T and PV).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "base/rng.h"
#include "base/timer.h"
#include "cli/args.h"
#include "cli/bench.h"
#include "kernels/matmul.h"
#include "kernels/roofline.h"
#include "model/synth.h"
#include "train/gemm.h"
#include "train/train.h"
#include "train/trainer.h"

namespace fathom::cli {
namespace {

struct TrainBenchOptions {
  int64_t tokens = 512;   // GEMM m
  int64_t hidden = 1024;  // GEMM in
  int64_t inter = 2816;   // GEMM out
  std::string preset = "tiny";
  int64_t layers = 4;
  int64_t vocab = 8192;
  int64_t n_seq = 4;
  int64_t seq_len = 128;
  double seconds = 1.0;
  bool json = false;
};

double now_s() {
  return static_cast<double>(now_ns()) * 1e-9;
}

// Best seconds per call of fn over about `budget` seconds (at least 2 calls).
template <class Fn>
double time_best(Fn&& fn, double budget) {
  fn();  // warm-up
  double best = 1e30;
  const double start = now_s();
  int calls = 0;
  while (calls < 2 || now_s() - start < budget) {
    const double t0 = now_s();
    fn();
    best = std::min(best, now_s() - t0);
    ++calls;
  }
  return best;
}

nlohmann::json bench_gemms(const TrainBenchOptions& o, double peak) {
  const int64_t m = o.tokens, in = o.hidden, out = o.inter;
  Rng rng(1);
  std::vector<float> x(static_cast<size_t>(m * in)), w(static_cast<size_t>(out * in)),
      dy(static_cast<size_t>(m * out));
  std::vector<float> y(dy.size()), dx(x.size()), dw(w.size());
  for (auto* v : {&x, &w, &dy}) {
    for (float& f : *v) f = rng.uniform_f(-1, 1);
  }
  const double flops = 2.0 * static_cast<double>(m * in * out);
  const WeightView view{.dtype = DType::kF32, .rows = out, .cols = in, .data = w.data()};
  const double fwd = time_best([&] { matmul(view, x.data(), m, y.data()); }, o.seconds / 3);
  const double bin =
      time_best([&] { train::gemm_nn(m, in, out, dy.data(), w.data(), dx.data(), false); }, o.seconds / 3);
  const double bwt =
      time_best([&] { train::gemm_tn(out, in, m, dy.data(), x.data(), dw.data()); }, o.seconds / 3);
  auto row = [&](const char* name, double s) {
    const double gf = flops / s * 1e-9;
    if (!o.json) std::printf("%-28s %9.1f us %8.1f GFLOP/s %6.3f of peak\n", name, s * 1e6, gf, gf / peak);
    return nlohmann::json{{"name", name}, {"us", s * 1e6}, {"gflops", gf}, {"peak_frac", gf / peak}};
  };
  if (!o.json)
    std::printf("GEMM m=%lld in=%lld out=%lld (fp32)\n", static_cast<long long>(m),
                static_cast<long long>(in), static_cast<long long>(out));
  nlohmann::json j = {{"m", m}, {"in", in}, {"out", out}};
  j["forward_runtime_matmul"] = row("forward Y=X.W^T (kernels/)", fwd);
  j["backward_input_gemm_nn"] = row("B: dX=dY.W (train/gemm)", bin);
  j["backward_weight_gemm_tn"] = row("W: dW+=dY^T.X (train/gemm)", bwt);
  j["b_over_forward"] = fwd / bin;
  j["w_over_forward"] = fwd / bwt;
  if (!o.json) std::printf("ratios vs forward: B %.2f, W %.2f\n", fwd / bin, fwd / bwt);
  return j;
}

Result<nlohmann::json> bench_step(const TrainBenchOptions& o, double peak) {
  SynthOptions so;
  so.preset = o.preset;
  so.layers = o.layers;
  so.vocab = o.vocab;
  ModelConfig c = TRY(synth_config(so, o.vocab));
  c.num_nextn_predict_layers = 1;
  const train::ParamLayout layout = TRY(train::make_param_layout(c, true));
  auto params = train::make_params<float>(layout);
  auto grads = train::make_params<float>(layout);
  train::init_params(params, 1);
  const train::SeqShape shape{o.n_seq, o.seq_len};
  Rng rng(2);
  std::vector<int32_t> tokens(static_cast<size_t>(shape.tokens())), targets(tokens.size());
  for (auto& t : tokens) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(c.vocab_size)));
  for (size_t i = 0; i < tokens.size(); ++i) {
    targets[i] = (i + 1) % static_cast<size_t>(o.seq_len) == 0 ? -1 : tokens[i + 1];
  }
  auto ctx = train::make_model_context<float>();
  double fwd_s = 1e30, step_s = 1e30;
  Status status;
  step_s = time_best(
      [&] {
        const double t0 = now_s();
        auto r = train::model_forward(params, shape, tokens, targets, {}, *ctx);
        if (!r.ok()) status = r.status();
        fwd_s = std::min(fwd_s, now_s() - t0);
        train::model_backward(params, *ctx, 1.0, grads);
      },
      o.seconds);
  TRY(status);
  const double flops = 3.0 * train::model_forward_flops(layout, shape);
  const double tps = static_cast<double>(shape.tokens()) / step_s;
  const double mfu = flops / step_s * 1e-9 / peak;
  if (!o.json) {
    std::printf("step: %s x%lld layers, hidden %lld, vocab %lld, batch %lld x %lld, %lld params\n",
                o.preset.c_str(), static_cast<long long>(c.num_hidden_layers),
                static_cast<long long>(c.hidden_size), static_cast<long long>(c.vocab_size),
                static_cast<long long>(o.n_seq), static_cast<long long>(o.seq_len),
                static_cast<long long>(layout.total));
    std::printf(
        "  forward %.1f ms, forward+backward %.1f ms, %.0f tokens/s, %.2f GFLOP/step, MFU %.3f of fp32 "
        "peak\n",
        fwd_s * 1e3, step_s * 1e3, tps, flops * 1e-9, mfu);
  }
  return nlohmann::json{{"preset", o.preset},
                        {"layers", c.num_hidden_layers},
                        {"hidden", c.hidden_size},
                        {"vocab", c.vocab_size},
                        {"n_seq", o.n_seq},
                        {"seq_len", o.seq_len},
                        {"params", layout.total},
                        {"forward_ms", fwd_s * 1e3},
                        {"step_ms", step_s * 1e3},
                        {"tokens_per_s", tps},
                        {"model_gflop_per_step", flops * 1e-9},
                        {"mfu", mfu}};
}

int run_train_bench(int argc, char** argv) {
  TrainBenchOptions o;
  Args args(argv[0], "Measure the training path (backward GEMMs, a whole-model step) against the fp32 peak.");
  args.option("--tokens", &o.tokens, "GEMM rows m (tokens of a micro-batch)");
  args.option("--hidden", &o.hidden, "GEMM input features");
  args.option("--inter", &o.inter, "GEMM output features");
  args.option("--preset", &o.preset, "model shape for the step: tiny|v2-lite|v3 (see fathom synth)", "NAME");
  args.option("--layers", &o.layers, "decoder layers of the step's model");
  args.option("--vocab", &o.vocab, "vocabulary of the step's model");
  args.option("--n-seq", &o.n_seq, "sequences per micro-batch");
  args.option("--seq-len", &o.seq_len, "tokens per sequence");
  args.option("--seconds", &o.seconds, "time budget per measurement");
  args.flag("--json", &o.json, "print one JSON object");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  if (o.tokens < 1 || o.hidden < 1 || o.inter < 1 || o.n_seq < 1 || o.seq_len < 2 || o.layers < 1 ||
      o.vocab < 2) {
    return fail(args.command(),
                invalid_argument("shapes must be positive (--seq-len at least 2, --vocab at least 2)"));
  }
  ThreadPool& pool = default_pool();
  std::fprintf(stderr, "measuring peak compute (%d threads)...\n", pool.size());
  const PeakCompute pk = measure_peak_compute(pool);
  if (!o.json) std::printf("threads %d, fp32 FMA peak %.1f GFLOP/s\n", pool.size(), pk.f32_gflops);
  nlohmann::json j = {{"threads", pool.size()}, {"f32_gflops", pk.f32_gflops}};
  j["gemm"] = bench_gemms(o, pk.f32_gflops);
  auto step = bench_step(o, pk.f32_gflops);
  if (!step.ok()) return fail(args.command(), step.status());
  j["step"] = *step;
  if (o.json) print_json_line(j.dump());
  return 0;
}

}  // namespace

FATHOM_BENCH("train", "training path: backward GEMMs and a whole-model step vs the fp32 peak",
             run_train_bench);

}  // namespace fathom::cli
