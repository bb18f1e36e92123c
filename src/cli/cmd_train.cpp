// `fathom train`: single-process training of a DeepSeek-V3-architecture model on a
// fathom-tokens-v1 directory (train/trainer.h). SIGINT / SIGTERM stop after the current step with
// a checkpoint; `--resume` continues a run bit-identically.
#include <malloc.h>

#include <csignal>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "base/fs.h"
#include "base/thread_pool.h"
#include "cli/args.h"
#include "cli/command.h"
#include "kernels/roofline.h"
#include "model/synth.h"
#include "train/pipelined.h"
#include "train/trainer.h"

namespace fathom::cli {

// train_pipelined_cli.cpp: `--schedule` runs the steps on pipeline stages under MPI.
Result<std::unique_ptr<train::PipelinedTraining>> make_pipelined_training(const std::string& schedule,
                                                                          const std::string& stage_layers,
                                                                          const ModelConfig& config,
                                                                          train::TrainerOptions& o,
                                                                          bool threads_given);

namespace {

std::atomic<bool> g_stop{false};

void on_signal(int) {
  g_stop.store(true);
}

void install_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESETHAND;  // a second signal kills as usual
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

// The model: --config FILE, or a synth preset (--preset) resized by --layers / --experts, with
// the data's vocabulary.
Result<ModelConfig> model_config(const std::string& config_path, const std::string& preset,
                                 std::optional<int64_t> layers, std::optional<int64_t> experts, bool mtp,
                                 const std::string& data_dir) {
  SynthOptions so;
  so.config_path = config_path;
  so.preset = preset;
  so.layers = layers;
  so.experts = experts;
  so.mtp = mtp;
  if (config_path.empty()) {
    const train::TokenData d = TRY(train::load_token_data(data_dir, 1));
    so.vocab = d.meta.vocab_size;
  }
  ModelConfig c = TRY(synth_config(so, 0));
  c.torch_dtype = "bfloat16";
  return c;
}

int run_train(int argc, char** argv) {
  train::TrainerOptions o;
  std::string config_path, preset = "tiny", schedule, stage_layers;
  std::optional<int64_t> layers, experts, seed;
  double time_budget_min = 0;
  bool json_out = false, no_peak = false;
  Args args(
      argv[0],
      "Train a DeepSeek-V3-architecture model (MLA, DeepSeekMoE with aux-loss-free balancing, optional MTP)\n"
      "in one process on a fathom-tokens-v1 directory. Writes RUN_DIR/checkpoint.bin, run.json, log.jsonl\n"
      "and loss.svg; SIGINT/SIGTERM checkpoint and stop; --resume continues bit-identically.");
  args.usage("--data DIR (--config config.json | --preset tiny [--layers N]) --out RUN_DIR [options]");
  args.option("--data", &o.data_dir, "token directory (meta.json, train.bin, val.bin, tokenizer.json)",
              "DIR");
  args.option("--config", &config_path, "model shape: a Hugging Face config.json (vocab_size = the data's)",
              "FILE");
  args.option("--preset", &preset,
              "model shape when no --config: a `fathom synth` preset (vocab from the data)", "NAME");
  args.option("--layers", &layers, "override num_hidden_layers");
  args.option("--experts", &experts, "override n_routed_experts");
  args.option("--out", &o.out_dir, "run directory", "RUN_DIR");
  args.option("--steps", &o.steps, "optimizer steps in total");
  args.option("--seq-len", &o.seq_len, "tokens per sequence");
  args.option("--batch", &o.batch, "sequences per micro-batch");
  args.option("--micro-batches", &o.micro_batches, "micro-batches per step (gradient accumulation)");
  args.option("--lr", &o.schedule.lr, "peak learning rate");
  args.option("--min-lr", &o.schedule.min_lr, "final learning rate of the cosine decay");
  args.option("--warmup", &o.schedule.warmup, "linear warmup steps");
  args.option("--weight-decay", &o.adamw.weight_decay,
              "AdamW decoupled weight decay (not on norms/biases)");
  args.option("--clip", &o.clip, "global gradient-norm clip (0: off)");
  args.option("--seed", &seed, "initialisation and data-order seed [0]");
  args.flag("--mtp", &o.mtp, "train the multi-token-prediction module too");
  args.option("--mtp-weight", &o.model.mtp_weight, "MTP loss weight");
  args.option("--eval-every", &o.eval_every, "validation every N steps (0: at the end)");
  args.option("--eval-batches", &o.eval_batches, "validation micro-batches");
  args.option("--save-every", &o.save_every, "checkpoint every N steps (0: at the end)");
  args.flag("--resume", &o.resume, "continue RUN_DIR/checkpoint.bin (same options)");
  args.option("--init-from", &o.init_from,
              "start a new run from a Hugging Face checkpoint's weights (e.g. a `fathom export --dtype f32` "
              "directory; fresh optimizer state)",
              "DIR");
  args.option("--prev-token-heads", &o.prev_token_heads,
              "build N heads of decoder layer 0 as previous-token heads at initialisation (the first half "
              "of the induction circuit that copying from the context needs; docs/train.md)",
              "N");
  args.flag("--induction-heads", &o.induction_heads,
            "build the whole induction circuit at initialisation: a previous-token head in layer 0 and a "
            "head in layer 1 that copies the token which followed the current token's earlier occurrence; "
            "other residual branches start at zero (docs/train.md)");
  args.flag("--bf16", &o.bf16_gemms,
            "compute the matrix products in bf16 where AMX tiles run them (fp32 master weights, optimizer "
            "and other ops; docs/train.md)");
  args.option("--time-budget", &time_budget_min, "stop cleanly with a checkpoint after this many minutes",
              "MINUTES");
  args.flag("--no-peak", &no_peak, "skip measuring the fp32 peak (no MFU)");
  args.flag("--json", &json_out, "print one JSON summary line");
  args.option("--schedule", &schedule,
              "pipeline-parallel under MPI: 1f1b|zb1p|gpipe|dualpipe|dualpipev (mpirun -np N fathom train ...)",
              "NAME");
  args.option("--stage-layers", &stage_layers, "with --schedule: decoder layers per stage, e.g. 3,1", "N,N,...");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  if (seed) o.seed = static_cast<uint64_t>(*seed);
  if (time_budget_min < 0)
    return fail(args.command(), invalid_argument("--time-budget must not be negative"));
  o.time_budget_s = time_budget_min * 60;
  if (!schedule.empty() && !o.init_from.empty()) {
    return fail(args.command(),
                invalid_argument("--init-from is for single-process runs (not with --schedule)"));
  }
  o.schedule.steps = o.steps;
  auto config = model_config(config_path, preset, layers, experts, o.mtp, o.data_dir);
  if (!config.ok()) return fail(args.command(), config.status());
  if (!no_peak) o.peak_gflops = measure_peak_compute(default_pool(), 0.2).f32_gflops;
  // Some layers' per-call scratch vectors are large: keep freed blocks in the heap instead of
  // returning them to the kernel, so later steps do not page-fault their scratch in again (perf
  // showed page faults under memset/memmove in a step's profile).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's maximum on 64-bit; larger values are refused
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  install_handlers();
  o.stop = &g_stop;
  std::unique_ptr<train::PipelinedTraining> pp;
  if (!schedule.empty()) {
    auto made = make_pipelined_training(schedule, stage_layers, *config, o, args.given("--threads"));
    if (!made.ok()) return fail(args.command(), made.status());
    pp = std::move(*made);
  }
  auto r = train::train_model(*config, o, pp ? pp->computer() : nullptr);
  if (pp && pp->rank() != 0) return r.ok() ? 0 : 1;  // rank 0 reports
  if (!r.ok()) return fail(args.command(), r.status());
  if (pp && pp->stopped_by_budget()) r->interrupted = false;
  if (json_out) {
    nlohmann::json j = {{"steps", r->step},
                        {"params", r->params},
                        {"first_loss", r->first_loss},
                        {"last_loss", r->last_loss},
                        {"val_loss", r->val_loss},
                        {"tokens_per_s", r->tokens_per_s},
                        {"mfu_fp32", r->mfu},
                        {"peak_fp32_gflops", o.peak_gflops},
                        {"seconds", r->seconds},
                        {"interrupted", r->interrupted},
                        {"checkpoint", r->checkpoint}};
    if (pp) {
      j["schedule"] = schedule;
      j["ranks"] = pp->schedule().params.n_ranks;
      j["bubble_fraction"] = pp->mean_bubble_fraction();
    }
    print_json_line(j.dump());
  } else {
    if (r->losses.empty()) {
      std::printf("nothing to do: the run is at step %lld of --steps %lld; checkpoint %s\n",
                  static_cast<long long>(r->step), static_cast<long long>(o.steps), r->checkpoint.c_str());
    } else {
      const std::string val = r->val_loss >= 0 ? fmt::format(", val {:.4f}", r->val_loss) : std::string();
      std::printf("trained %.2fM parameters to step %lld: loss %.4f (first %.4f)%s, %.0f tokens/s",
                  static_cast<double>(r->params) * 1e-6, static_cast<long long>(r->step), r->last_loss,
                  r->first_loss, val.c_str(), r->tokens_per_s);
      if (o.peak_gflops > 0) std::printf(", MFU %.3f of the fp32 peak (%.0f GFLOP/s)", r->mfu, o.peak_gflops);
      std::printf("%s; checkpoint %s\n", r->interrupted ? " [interrupted]" : "", r->checkpoint.c_str());
    }
  }
  return r->interrupted ? 130 : 0;
}

}  // namespace

FATHOM_COMMAND("train",
               "train a DeepSeek-V3-architecture model in one process (checkpoints, resume, log, curve)",
               run_train);

}  // namespace fathom::cli
