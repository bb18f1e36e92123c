// `mpirun -np N fathom pipeline train --model deepseek ...`: pipelined training of a DeepSeek-V3
// model (train/pipelined.h) on a schedule, from a preset or a config.json, with the measured bubble
// next to the simulator's, pictures of the last step, and --verify against one process.
// cmd_pipeline.cpp hands `pipeline train --model deepseek` here; the MLP demo stays there.
#include <cstdio>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "base/thread_pool.h"
#include "cli/args.h"
#include "cli/command.h"
#include "model/synth.h"
#include "pipeline/trainer.h"
#include "train/pipelined.h"

namespace fathom::cli {

namespace {

using train::PipelinedOptions;
using train::PipelinedReport;

struct Cli {
  std::string preset = "tiny", config, schedule = "dualpipe", dtype = "f32";
  std::optional<int64_t> layers, experts, vocab;
  int microbatches = 0;
  int64_t steps = 3, n_seq = 1, seq_len = 32, seed = 1, warmup = 0;
  double lr = 1e-3, min_lr = 1e-4, weight_decay = 0.1, clip = 1.0, init_scale = 1.0, delay_ms = 0;
  double mtp_weight = 0.3, balance_alpha = 1e-4, bias_speed = 1e-3;
  bool no_mtp = false, verify = false, grid = false, json = false;
  std::string model, trace, svg, fault, stage_layers;
};

void add_options(Args& a, Cli& c) {
  a.option("--model", &c.model, "deepseek: DeepSeek-V3 layers (without it: the MLP demo)", "NAME");
  a.option("--preset", &c.preset, "model shape: tiny|v2-lite|v3 (see fathom synth)", "NAME");
  a.option("--config", &c.config, "take the shape from this config.json instead", "FILE");
  a.option("--layers", &c.layers, "override num_hidden_layers");
  a.option("--experts", &c.experts, "override n_routed_experts");
  a.option("--vocab", &c.vocab, "override vocab_size (default 512 for presets without one)");
  a.option("--stage-layers", &c.stage_layers,
           "decoder layers per stage, e.g. 3,1 (default: equal runs; the last stage also holds head and MTP)",
           "N,N,...");
  a.option("--schedule", &c.schedule, "gpipe|1f1b|zb1p|dualpipe|dualpipev", "NAME");
  a.option("--microbatches", &c.microbatches, "micro-batches per step (0: 2 per stage)");
  a.option("--steps", &c.steps, "optimizer steps");
  a.option("--n-seq", &c.n_seq, "sequences per micro-batch");
  a.option("--seq-len", &c.seq_len, "tokens per sequence");
  a.option("--dtype", &c.dtype, "f32|f64", "TYPE");
  a.flag("--no-mtp", &c.no_mtp, "leave the MTP module out");
  a.option("--mtp-weight", &c.mtp_weight, "lambda of the MTP loss");
  a.option("--balance-alpha", &c.balance_alpha, "weight of the sequence-wise balance loss");
  a.option("--bias-speed", &c.bias_speed, "gamma of the aux-loss-free router bias update");
  a.option("--lr", &c.lr, "peak AdamW learning rate");
  a.option("--min-lr", &c.min_lr, "cosine floor");
  a.option("--warmup", &c.warmup, "linear warmup steps");
  a.option("--weight-decay", &c.weight_decay, "decoupled weight decay on 2-D tensors");
  a.option("--clip", &c.clip, "max global gradient norm (0: off)");
  a.option("--seed", &c.seed, "parameter and data seed");
  a.option("--init-scale", &c.init_scale, "scale of the random projections");
  a.option("--delay-ms", &c.delay_ms, "sleep up to this long before each op (results must not change)");
  a.flag("--verify", &c.verify, "compare with a single-process run (exit 1 if it differs)");
  a.option("--inject-fault", &c.fault, "testing --verify: drop-weight-grad|corrupt-activation on rank 0",
           "NAME");
  a.option("--trace", &c.trace, "write the last step as a Chrome trace JSON", "FILE");
  a.option("--svg", &c.svg, "write the last step as an SVG timeline", "FILE");
  a.flag("--grid", &c.grid, "print the last step as a text grid");
  a.flag("--json", &c.json, "print one JSON object");
}

Result<ModelConfig> model_config(const Cli& c, bool mtp) {
  SynthOptions so;
  so.preset = c.preset;
  so.config_path = c.config;
  so.layers = c.layers;
  so.experts = c.experts;
  so.vocab = c.vocab;
  if (!so.vocab && c.config.empty()) so.vocab = 512;
  so.mtp = mtp;
  so.dtype = DType::kF32;
  ModelConfig config = TRY(synth_config(so, 0));
  if (!c.config.empty() && !mtp) config.num_nextn_predict_layers = 0;
  return config;
}

// "3,1" -> {3, 1}.
Result<std::vector<int64_t>> parse_stage_layers(std::string_view text) {
  std::vector<int64_t> out;
  for (std::string_view rest = text; !rest.empty();) {
    const size_t comma = rest.find(',');
    const std::string item(rest.substr(0, comma));
    char* end = nullptr;
    const long long n = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0') return invalid_argument("--stage-layers: '{}' is not a layer count", item);
    out.push_back(n);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  return out;
}

Result<PipelinedOptions> pipelined_options(const Cli& c, int n_ranks) {
  PipelinedOptions o;
  o.schedule = TRY(pipeline::parse_schedule_kind(c.schedule));
  const int stages = o.schedule == pipeline::ScheduleKind::kDualPipeV ? 2 * n_ranks : n_ranks;
  o.microbatches = c.microbatches > 0 ? c.microbatches : 2 * stages;
  o.steps = c.steps;
  o.shape = {c.n_seq, c.seq_len};
  if (c.dtype != "f32" && c.dtype != "f64")
    return invalid_argument("--dtype must be f32 or f64, got '{}'", c.dtype);
  o.f64 = c.dtype == "f64";
  o.mtp = !c.no_mtp;
  o.train = {.mtp_weight = c.mtp_weight, .balance_alpha = c.balance_alpha, .bias_update_speed = c.bias_speed};
  if (!(c.lr > 0) || c.min_lr < 0 || c.min_lr > c.lr) {
    return invalid_argument("--lr must be positive and --min-lr within [0, lr], got {} and {}", c.lr,
                            c.min_lr);
  }
  if (c.warmup < 0 || c.clip < 0 || c.weight_decay < 0 || c.delay_ms < 0 || !(c.init_scale > 0)) {
    return invalid_argument("--warmup, --clip, --weight-decay and --delay-ms must be >= 0, --init-scale > 0");
  }
  o.optimizer = {.lr = c.lr,
                 .min_lr = c.min_lr,
                 .warmup_steps = c.warmup,
                 .weight_decay = c.weight_decay,
                 .grad_clip = c.clip};
  o.seed = uint64_t(c.seed);
  o.init_scale = c.init_scale;
  o.verify = c.verify;
  o.delay_ms_max = c.delay_ms;
  o.stage_layers = TRY(parse_stage_layers(c.stage_layers));
  if (c.fault == "drop-weight-grad") {
    o.fault = pipeline::ExecutorOptions::Fault::kDropWeightGradient;
  } else if (c.fault == "corrupt-activation") {
    o.fault = pipeline::ExecutorOptions::Fault::kCorruptActivation;
  } else if (!c.fault.empty()) {
    return invalid_argument("--inject-fault must be drop-weight-grad or corrupt-activation, got '{}'",
                            c.fault);
  }
  return o;
}

nlohmann::json loss_json(const train::StepLoss& l) {
  return {{"total", l.total}, {"ce", l.ce}, {"mtp_ce", l.mtp_ce}, {"balance", l.balance}};
}

nlohmann::json report_json(const PipelinedOptions& o, const PipelinedReport& r) {
  nlohmann::json steps = nlohmann::json::array(), losses = nlohmann::json::array();
  for (const auto& m : r.steps) {
    nlohmann::json costs = {{"f", m.costs.f}, {"b", m.costs.b}, {"w", m.costs.w}, {"p2p", m.costs.p2p}};
    if (m.costs.fb) costs["fb"] = *m.costs.fb;
    if (m.costs.bi) costs["bi"] = *m.costs.bi;
    steps.push_back({{"makespan_ms", m.makespan_ms},
                     {"busy_ms", m.busy_ms},
                     {"idle_ms", m.idle_ms},
                     {"bubble_fraction", m.bubble_fraction},
                     {"predicted_bubble_fraction", m.predicted_bubble_fraction},
                     {"predicted_rank_bubble_fraction", m.predicted_rank_bubble_fraction},
                     {"replayed_bubble_fraction", m.replayed_bubble_fraction},
                     {"sync_ms", m.sync_ms},
                     {"grad_norm", m.grad_norm},
                     {"lr", m.lr},
                     {"costs_ms", costs}});
  }
  for (const auto& step : r.losses) {
    nlohmann::json row = nlohmann::json::array();
    for (const auto& l : step) row.push_back(loss_json(l));
    losses.push_back(row);
  }
  nlohmann::json j = {{"model", "deepseek"},
                      {"schedule", pipeline::schedule_name(o.schedule)},
                      {"ranks", r.schedule.params.n_ranks},
                      {"stages", r.schedule.n_stages},
                      {"microbatches", o.microbatches},
                      {"steps", o.steps},
                      {"dtype", o.f64 ? "f64" : "f32"},
                      {"n_seq", o.shape.n_seq},
                      {"seq_len", o.shape.seq_len},
                      {"mtp", o.mtp},
                      {"parameters", r.parameters},
                      {"stage_parameters", r.stage_parameters},
                      {"losses", losses},
                      {"measured", steps},
                      {"params_digest", r.params_digest},
                      {"p2p_ms", r.p2p_ms},
                      {"tokens_per_s", r.tokens_per_s}};
  if (r.verification) {
    const auto& v = *r.verification;
    j["verify"] = {{"passed", v.passed()},
                   {"bound", v.bound},
                   {"first_step_losses_identical", v.first_step_losses_identical},
                   {"later_loss_rel_err", v.later_loss_rel_err},
                   {"grad_rel_err", v.grad_rel_err},
                   {"param_rel_err", v.param_rel_err},
                   {"replicas_identical", v.replicas_identical}};
  }
  return j;
}

void print_report(const PipelinedOptions& o, const PipelinedReport& r) {
  const auto& s = r.schedule;
  std::printf(
      "deepseek %s: %d ranks, %d stages, %d micro-batches of %lld x %lld tokens, %s, %lld parameters%s\n",
      std::string(pipeline::schedule_name(o.schedule)).c_str(), s.params.n_ranks, s.n_stages, o.microbatches,
      (long long)o.shape.n_seq, (long long)o.shape.seq_len, o.f64 ? "f64" : "f32", (long long)r.parameters,
      o.mtp ? ", MTP" : "");
  for (size_t k = 0; k < r.steps.size(); ++k) {
    double total = 0, ce = 0;
    for (const auto& l : r.losses[k])
      total += l.total / double(r.losses[k].size()), ce += l.ce / double(r.losses[k].size());
    const auto& m = r.steps[k];
    std::printf(
        "step %zu: loss %.6f (ce %.6f), grad norm %.3f, lr %.2e, %.1f ms, bubble %.1f%% measured, "
        "predicted %.1f%% from per-rank costs, %.1f%% from mean costs, %.1f%% replayed "
        "(F %.2f B %.2f W %.2f ms)\n",
        k, total, ce, m.grad_norm, m.lr, m.makespan_ms, 100 * m.bubble_fraction,
        100 * m.predicted_rank_bubble_fraction, 100 * m.predicted_bubble_fraction,
        100 * m.replayed_bubble_fraction, m.costs.f, m.costs.b, m.costs.w);
  }
  std::printf("%.0f tokens/s\n", r.tokens_per_s);
  if (r.verification) {
    const auto& v = *r.verification;
    std::printf(
        "verify against one process: %s; first-step losses %s, later losses rel err %.2e, gradients %.2e, "
        "parameters %.2e (bound %.0e), copies %s\n",
        v.passed() ? "PASSED" : "FAILED", v.first_step_losses_identical ? "bit-identical" : "DIFFER",
        v.later_loss_rel_err, v.grad_rel_err, v.param_rel_err, v.bound,
        v.replicas_identical ? "bit-identical" : "DIFFER");
  }
  std::printf("parameters digest %s\n", r.params_digest.c_str());
}

Status write_file(const std::string& path, const std::string& text) {
  if (path.empty()) return ok_status();
  std::ofstream f(path, std::ios::binary);
  f << text;
  if (!f) return io_error("cannot write '{}'", path);
  return ok_status();
}

}  // namespace

// `fathom train --schedule S` (cmd_train.cpp): MPI, this rank's stages and the executor behind the
// trainer's StepComputer; adjusts the trainer's options (see train/pipelined.h).
Result<std::unique_ptr<train::PipelinedTraining>> make_pipelined_training(const std::string& schedule,
                                                                          const std::string& stage_layers,
                                                                          const ModelConfig& config,
                                                                          train::TrainerOptions& o,
                                                                          bool threads_given) {
  train::PipelinedTrainingOptions p;
  p.schedule = TRY(pipeline::parse_schedule_kind(schedule));
  p.stage_layers = TRY(parse_stage_layers(stage_layers));
  p.time_budget_s = o.time_budget_s;
  p.signal = o.stop;
  p.set_threads = !threads_given && std::getenv("FATHOM_THREADS") == nullptr;
  return train::PipelinedTraining::create(config, o, p);
}

int run_pipeline_train_deepseek(int argc, char** argv) {
  Cli c;
  Args args(argv[0], "Train DeepSeek-V3 layers with a pipeline schedule under MPI (mpirun -np N ...).");
  add_options(args, c);
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  if (c.model != "deepseek")
    return fail(args.command(), invalid_argument("--model must be deepseek, got '{}'", c.model));
  pipeline::MpiSession mpi;
  if (!args.given("--threads") && std::getenv("FATHOM_THREADS") == nullptr) {
    set_default_pool_threads(pipeline::threads_per_local_rank(MPI_COMM_WORLD));
  }
  auto options = pipelined_options(c, mpi.size());
  if (!options.ok()) return fail(args.command(), options.status());
  auto config = model_config(c, options->mtp);
  if (!config.ok()) return fail(args.command(), config.status());
  auto batches = train::make_synthetic_batches(*config, options->shape, options->seed);
  auto report = train::train_pipelined(*config, *options, *batches, MPI_COMM_WORLD);
  if (!report.ok()) return fail(args.command(), report.status());
  if (mpi.rank() != 0) return 0;
  Status st = write_file(c.trace, pipeline::render_chrome_trace(report->timeline));
  if (st.ok()) st = write_file(c.svg, pipeline::render_svg(report->timeline));
  if (!st.ok()) return fail(args.command(), st);
  if (c.json) {
    print_json_line(report_json(*options, *report).dump());
  } else {
    if (c.grid) std::printf("%s", pipeline::render_grid(report->timeline).c_str());
    print_report(*options, *report);
  }
  if (report->verification && !report->verification->passed()) {
    return fail(args.command(), internal_error("the pipelined run differs from the single-process run"));
  }
  return 0;
}

}  // namespace fathom::cli
