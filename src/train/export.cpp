// `fathom export`: a trainer checkpoint to a checkpoint the runtime (and other engines) load,
// through the very writers `fathom synth` uses (model/synth.h with the trained weights as the
// value source): Hugging Face safetensors in bf16 / f32 / DeepSeek FP8 (e4m3 + weight_scale_inv
// per 128x128 block) with config.json and the data's tokenizer files, or GGUF (deepseek2).
#include <filesystem>

#include "base/fs.h"
#include "formats/model_config.h"
#include "model/synth.h"
#include "tensor/dtype.h"
#include "train/trainer.h"

namespace fathom::train {
namespace {

struct RunInfo {
  ModelConfig config;
  bool mtp = false;
  std::string data_dir;
};

Result<RunInfo> read_run(const std::string& run_dir) {
  const std::string path = (std::filesystem::path(run_dir) / "run.json").string();
  if (!path_exists(path))
    return not_found("export: {} is missing (is {} a `fathom train --out` directory?)", path, run_dir);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(TRY(read_file(path)));
  } catch (const std::exception& e) {
    return invalid_argument("export: {} is not valid JSON: {}", path, e.what());
  }
  if (!j.is_object() || !j.contains("config") || !j.contains("identity") || !j.contains("data")) {
    return invalid_argument("export: {} lacks config / identity / data", path);
  }
  RunInfo r;
  r.config = TRY(parse_hf_config(j["config"].dump(), path));
  r.mtp = j["identity"].value("mtp", false);
  r.data_dir = j["data"].get<std::string>();
  return r;
}

}  // namespace

Result<ExportResult> export_model(const ExportOptions& o) {
  if (o.out.empty()) return invalid_argument("export: --out is required");
  SynthOptions so;
  if (o.format == "hf") {
    so.format = CheckpointFormat::kHf;
  } else if (o.format == "gguf") {
    so.format = CheckpointFormat::kGguf;
  } else {
    return invalid_argument("export: --format '{}' is not hf or gguf", o.format);
  }
  so.dtype = TRY(parse_dtype(o.dtype));
  const RunInfo run = TRY(read_run(o.run_dir));
  ModelConfig c = run.config;
  c.num_nextn_predict_layers = run.mtp ? 1 : 0;
  const ParamLayout layout = TRY(make_param_layout(c, run.mtp));
  ModelParams<float> params = make_params<float>(layout);
  {
    AdamW adam(layout, {});
    const std::string ckpt = (std::filesystem::path(o.run_dir) / "checkpoint.bin").string();
    TRY(load_checkpoint(ckpt, layout, params.data, adam));
  }
  so.config = c;
  so.mtp = run.mtp;
  so.out = o.out;
  so.seed = 0;
  so.tokenizer_path = o.tokenizer_dir.empty() ? run.data_dir : o.tokenizer_dir;
  if (!path_exists((std::filesystem::path(so.tokenizer_path) / "tokenizer.json").string())) {
    return not_found("export: no tokenizer.json in {} (pass --tokenizer DIR)", so.tokenizer_path);
  }
  so.progress = false;
  std::string missing;
  so.weight_rows = [&](const HfWeight& w, int64_t r0, int64_t r1, float* out) {
    const ParamInfo* p = layout.find(w.name);
    if (p == nullptr && w.weight == LayerWeight::kMtpEmbed)
      p = layout.find(kHfEmbed);  // shared with the model
    if (p == nullptr && w.weight == LayerWeight::kMtpHead)  // the model's head: the embedding when tied
      p = layout.find(layout.config.tie_word_embeddings ? kHfEmbed : kHfHead);
    const int64_t cols = w.shape.back();
    if (p == nullptr || p->size != (w.shape.size() > 1 ? w.shape[0] : 1) * cols) {
      if (missing.empty()) missing = w.name;
      std::fill(out, out + (r1 - r0) * cols, 0.0f);
      return;
    }
    const float* src = params.at(*p) + r0 * cols;
    std::copy(src, src + (r1 - r0) * cols, out);
  };
  const SynthResult sr = TRY(synthesize(so));
  if (!missing.empty()) return internal_error("export: the trained slab has no tensor for '{}'", missing);
  return ExportResult{sr.config, sr.files, sr.bytes};
}

}  // namespace fathom::train
