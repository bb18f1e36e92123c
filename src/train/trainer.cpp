// The training loop of `fathom train`: data, sampler, StepComputer, clipping, AdamW, router-bias
// update, evaluation, checkpoints (periodic, at the end, on interruption or when the time budget
// is spent), RUN_DIR/log.jsonl and loss.svg. Gradient computation is the StepComputer's.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "base/fs.h"
#include "base/log.h"
#include "base/progress.h"
#include "base/timer.h"
#include "formats/model_config.h"
#include "train/curve.h"
#include "train/trainer.h"

#include "train/gemm.h"

namespace fathom::train {
namespace {

std::string run_path(const TrainerOptions& o, const char* name) {
  return (std::filesystem::path(o.out_dir) / name).string();
}

Status validate_options(const ModelConfig& c, const TrainerOptions& o) {
  if (o.data_dir.empty()) return invalid_argument("train: --data is required");
  if (o.out_dir.empty()) return invalid_argument("train: --out is required");
  if (o.steps < 1) return invalid_argument("train: --steps {} must be at least 1", o.steps);
  if (o.batch < 1) return invalid_argument("train: --batch {} must be at least 1", o.batch);
  if (o.micro_batches < 1)
    return invalid_argument("train: --micro-batches {} must be at least 1", o.micro_batches);
  if (o.seq_len < 2) return invalid_argument("train: --seq-len {} must be at least 2", o.seq_len);
  if (o.seq_len > c.max_position_embeddings) {
    return invalid_argument("train: --seq-len {} exceeds the config's max_position_embeddings {}", o.seq_len,
                            c.max_position_embeddings);
  }
  if (o.eval_batches < 1)
    return invalid_argument("train: --eval-batches {} must be at least 1", o.eval_batches);
  if (!(o.schedule.lr > 0) || !(o.schedule.min_lr >= 0) || o.schedule.min_lr > o.schedule.lr) {
    return invalid_argument("train: need 0 <= --min-lr ({}) <= --lr ({}) and --lr > 0", o.schedule.min_lr,
                            o.schedule.lr);
  }
  if (o.schedule.warmup < 0)
    return invalid_argument("train: --warmup {} must not be negative", o.schedule.warmup);
  if (o.adamw.weight_decay < 0) return invalid_argument("train: --weight-decay must not be negative");
  if (o.eval_every < 0 || o.save_every < 0)
    return invalid_argument("train: --eval-every / --save-every must be >= 0");
  if (o.prev_token_heads < 0 || o.prev_token_heads > c.num_attention_heads) {
    return invalid_argument("train: --prev-token-heads {} must be between 0 and the {} attention heads",
                            o.prev_token_heads, c.num_attention_heads);
  }
  if (o.induction_heads) {
    if (Status s = check_induction_shape(c); !s.ok()) return Status(s.code(), "train: " + s.message());
  }
  if (o.prev_token_heads > 0 && c.qk_rope_head_dim < 2) {
    return invalid_argument("train: --prev-token-heads needs rotary dimensions (qk_rope_head_dim is {})",
                            c.qk_rope_head_dim);
  }
  return {};
}

// What must not change across a resume (it would change the data or the numerics).
nlohmann::json run_identity(const TrainerOptions& o, const TokenData& d) {
  return {{"seq_len", o.seq_len},
          {"batch", o.batch},
          {"micro_batches", o.micro_batches},
          {"seed", o.seed},
          {"mtp", o.mtp},
          {"mtp_weight", o.model.mtp_weight},
          {"balance_alpha", o.model.balance_alpha},
          {"bias_update_speed", o.model.bias_update_speed},
          {"vocab_size", d.meta.vocab_size},
          {"n_train_tokens", d.meta.n_train_tokens},
          {"gemm_precision", o.bf16_gemms ? "bf16" : "f32"}};
}

struct LogRow {
  int64_t step = 0;
  int64_t tokens = 0;
  nlohmann::json j;
};

// Rows of an earlier log up to `step` (what a resumed run keeps).
std::vector<LogRow> read_log(const std::string& path, int64_t up_to_step) {
  std::vector<LogRow> rows;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    try {
      nlohmann::json j = nlohmann::json::parse(line);
      const int64_t s = j.at("step").get<int64_t>();
      if (s <= up_to_step) rows.push_back({s, j.value("tokens", int64_t{0}), std::move(j)});
    } catch (const std::exception&) {
      // A torn last line from a killed run: dropped.
    }
  }
  return rows;
}

Status write_curve(const TrainerOptions& o, const std::vector<LogRow>& rows) {
  std::vector<CurvePoint> pts;
  for (const LogRow& r : rows) {
    pts.push_back(
        {r.tokens, r.j.value("loss", 0.0), r.j.contains("val_loss") ? r.j["val_loss"].get<double>() : -1});
  }
  return write_file_atomic(run_path(o, "loss.svg"), loss_curve_svg(pts, "fathom train: " + o.out_dir));
}

Result<double> evaluate(StepComputer& comp, const ModelParams<float>& params, const std::vector<Batch>& val) {
  double sum = 0;
  for (const Batch& b : val) sum += TRY(comp.evaluate(params, b)).ce;
  return sum / static_cast<double>(val.size());
}

void update_router_bias(ModelParams<float>& params, const ModelConfig& c, const StepResult& r, double speed) {
  for (size_t l = 0; l < r.expert_loads.size() && l < params.layers.size(); ++l) {
    LayerParams<float>& L = params.layers[l];
    if (L.router_bias != nullptr && static_cast<int64_t>(r.expert_loads[l].size()) == c.n_routed_experts) {
      moe_update_bias(L.router_bias, r.expert_loads[l], speed);
    }
  }
}

}  // namespace

void warn_unreached(const TokenData& d, int64_t seq_len) {
  const double share = d.train.empty() ? 0.0 : static_cast<double>(d.train_unreached) / static_cast<double>(d.train.size());
  if (share < 0.01) return;
  log_warn(
      "train: {:.1f}% of {}/train.bin ({} of {} tokens) is never trained on: a sequence starts at a document "
      "start, so the tokens past the first --seq-len {} + 1 of each longer document are out of reach (longest "
      "document {} tokens); a longer --seq-len covers them",
      100.0 * share, d.dir, d.train_unreached, d.train.size(), seq_len, d.longest_train_doc);
}

Result<TrainSummary> train_model(const ModelConfig& config, const TrainerOptions& o, StepComputer* computer) {
  TRY(config.validate());
  TRY(validate_options(config, o));
  const ParamLayout layout = TRY(make_param_layout(config, o.mtp));
  const TokenData data = TRY(load_token_data(o.data_dir, o.seq_len));
  if (data.meta.vocab_size != config.vocab_size) {
    return invalid_argument(
        "train: the data's vocab_size {} ({}/meta.json) differs from the config's vocab_size {}",
        data.meta.vocab_size, o.data_dir, config.vocab_size);
  }
  warn_unreached(data, o.seq_len);
  std::unique_ptr<StepComputer> local;
  if (computer == nullptr) {
    local = make_local_step_computer(o.model);
    computer = local.get();
  }
  set_gemm_precision(o.bf16_gemms ? GemmPrecision::kBf16 : GemmPrecision::kF32);
  ModelParams<float> params = make_params<float>(layout);
  ModelParams<float> grads = make_params<float>(layout);
  init_params(params, o.seed, 1.0, o.induction_heads ? std::max(o.prev_token_heads, 1) : o.prev_token_heads);
  if (o.induction_heads) seed_induction_circuit(params, o.seed);
  if (!o.resume && !o.init_from.empty()) {
    const Status loaded = load_params_hf(params, o.init_from);
    if (!loaded.ok()) return Status(loaded.code(), fmt::format("train: --init-from: {}", loaded.message()));
  }
  AdamW adam(layout, o.adamw);
  Sampler sampler(data, o.seq_len, o.seed);
  TRY(make_directories(o.out_dir));
  const std::string ckpt = run_path(o, "checkpoint.bin");
  const nlohmann::json identity = run_identity(o, data);
  CheckpointState st;
  std::vector<LogRow> rows;
  if (o.resume) {
    st = TRY(load_checkpoint(ckpt, layout, params.data, adam));
    if (st.data_hash != data.hash) {
      return invalid_argument(
          "train: checkpoint {} was trained on different data than {} (token hash differs)", ckpt,
          o.data_dir);
    }
    if (!st.run.contains("gemm_precision"))
      st.run["gemm_precision"] = "f32";  // checkpoints before the option
    for (auto it = identity.begin(); it != identity.end(); ++it) {
      if (!st.run.contains(it.key()) || st.run[it.key()] != it.value()) {
        return invalid_argument(
            "train: checkpoint {} has {} = {}, this run {} (resume with the same options)", ckpt, it.key(),
            st.run.value(it.key(), nlohmann::json()).dump(), it.value().dump());
      }
    }
    if (st.cursor >= static_cast<int64_t>(data.train_starts.size())) {
      return corrupt("train: checkpoint {}: data position {} is past the {} sequence starts", ckpt, st.cursor,
                     data.train_starts.size());
    }
    sampler.seek(st.epoch, st.cursor);
    rows = read_log(run_path(o, "log.jsonl"), st.step);
    log_info("train: resumed {} at step {} ({} tokens)", ckpt, st.step, st.tokens);
  } else if (path_exists(ckpt)) {
    return already_exists(
        "train: {} already holds a checkpoint; pass --resume to continue it or choose a new --out",
        o.out_dir);
  }
  st.run = identity;
  st.data_hash = data.hash;
  nlohmann::json run = {{"config", hf_config_json(config)},
                        {"data", std::filesystem::absolute(o.data_dir).string()},
                        {"identity", identity},
                        {"init_from", o.init_from.empty() ? nlohmann::json() : nlohmann::json(o.init_from)},
                        {"prev_token_heads", o.prev_token_heads},
                        {"induction_heads", o.induction_heads},
                        {"lr", o.schedule.lr},
                        {"min_lr", o.schedule.min_lr},
                        {"warmup", o.schedule.warmup},
                        {"steps", o.steps},
                        {"weight_decay", o.adamw.weight_decay},
                        {"clip", o.clip}};
  TRY(write_file_atomic(run_path(o, "run.json"), run.dump(2) + "\n"));
  {
    std::string kept;
    for (const LogRow& r : rows) kept += r.j.dump() + "\n";
    TRY(write_file_atomic(run_path(o, "log.jsonl"), kept));
  }
  std::FILE* log_file = std::fopen(run_path(o, "log.jsonl").c_str(), "a");
  if (log_file == nullptr) return errno_status(errno, "open " + run_path(o, "log.jsonl"));
  struct Closer {
    std::FILE* f;
    ~Closer() { std::fclose(f); }
  } closer{log_file};

  const std::vector<Batch> val = validation_batches(data, o.seq_len, o.batch, o.eval_batches);
  std::vector<Batch> micro(static_cast<size_t>(o.micro_batches));
  const double step_flops =
      3.0 * model_forward_flops(layout, {o.batch, o.seq_len}) * static_cast<double>(o.micro_batches);
  const int64_t step_tokens = o.batch * o.seq_len * o.micro_batches;
  std::unique_ptr<ProgressBar> bar;
  if (o.progress)
    bar = std::make_unique<ProgressBar>(ProgressOptions{"train", static_cast<uint64_t>(o.steps)});
  if (bar) bar->set(static_cast<uint64_t>(st.step));

  TrainSummary sum;
  Timer timer;
  const double elapsed0 = st.elapsed_s;
  auto save = [&]() -> Status {
    st.epoch = sampler.epoch();
    st.cursor = sampler.cursor();
    st.elapsed_s = elapsed0 + timer.elapsed_s();
    return save_checkpoint(ckpt, st, layout, params.data, adam);
  };
  int64_t run_tokens = 0;
  double last_val = -1;
  while (st.step < o.steps) {
    if (o.stop != nullptr && o.stop->load()) {
      sum.interrupted = true;
      break;
    }
    if (o.time_budget_s > 0 && timer.elapsed_s() >= o.time_budget_s) {
      log_info("train: time budget of {:.1f} min spent at step {}", o.time_budget_s / 60, st.step);
      break;
    }
    const double t0 = timer.elapsed_s();
    for (Batch& b : micro) sampler.next(o.batch, b);
    std::fill(grads.data.begin(), grads.data.end(), 0.0f);
    const StepResult r = TRY(computer->compute(params, micro, grads));
    if (!std::isfinite(r.loss.total)) {
      return failed_precondition(
          "train: loss is {} at step {} (lower --lr or raise --warmup; last checkpoint: {})", r.loss.total,
          st.step + 1, ckpt);
    }
    const double norm = clip_grad_norm(layout, grads.data, o.clip);
    const double lr = o.schedule.at(st.step);
    adam.step(lr, params.data, grads.data);
    update_router_bias(params, config, r, o.model.bias_update_speed);
    ++st.step;
    st.tokens += step_tokens;
    run_tokens += step_tokens;
    const double dt = timer.elapsed_s() - t0;
    nlohmann::json j = {{"step", st.step},
                        {"loss", r.loss.total},
                        {"ce", r.loss.ce},
                        {"mtp_ce", r.loss.mtp_ce},
                        {"balance", r.loss.balance},
                        {"lr", lr},
                        {"grad_norm", norm},
                        {"tokens", st.tokens},
                        {"tokens_per_s", step_tokens / dt},
                        {"elapsed_s", elapsed0 + timer.elapsed_s()}};
    if (o.peak_gflops > 0) j["mfu"] = step_flops / dt * 1e-9 / o.peak_gflops;
    const bool eval_now = (o.eval_every > 0 && st.step % o.eval_every == 0) || st.step == o.steps;
    if (eval_now) {
      last_val = TRY(evaluate(*computer, params, val));
      j["val_loss"] = last_val;
    }
    std::fputs((j.dump() + "\n").c_str(), log_file);
    std::fflush(log_file);
    rows.push_back({st.step, st.tokens, j});
    if (eval_now) TRY(write_curve(o, rows));
    if (sum.losses.empty()) sum.first_loss = r.loss.total;
    sum.losses.push_back(r.loss.total);
    sum.last_loss = r.loss.total;
    if (bar) {
      bar->set_note(fmt::format("loss {:.4f} lr {:.2e} {:.0f} tok/s{}", r.loss.total, lr,
                                static_cast<double>(run_tokens) / timer.elapsed_s(),
                                last_val >= 0 ? fmt::format(" val {:.4f}", last_val) : ""));
      bar->set(static_cast<uint64_t>(st.step));
    }
    if (o.save_every > 0 && st.step % o.save_every == 0 && st.step < o.steps) TRY(save());
  }
  if (bar) bar->finish();
  TRY(save());
  TRY(write_curve(o, rows));
  sum.step = st.step;
  sum.params = layout.total;
  sum.val_loss = last_val;
  sum.seconds = timer.elapsed_s();
  sum.tokens_per_s = sum.seconds > 0 ? static_cast<double>(run_tokens) / sum.seconds : 0;
  if (o.peak_gflops > 0 && sum.seconds > 0 && !sum.losses.empty()) {
    sum.mfu = step_flops * static_cast<double>(sum.losses.size()) / sum.seconds * 1e-9 / o.peak_gflops;
  }
  sum.checkpoint = ckpt;
  return sum;
}

}  // namespace fathom::train
