// `fathom inspect PATH [--json]`: a safetensors file, a GGUF file or a Hugging Face directory:
// format, metadata, every tensor, totals and, for models, the parsed config with parameter counts
// and KV-cache bytes per token. Opening reads headers only (O(header), never tensor data).
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>

#include "base/fs.h"
#include "base/progress.h"
#include "base/strings.h"
#include "cli/args.h"
#include "cli/command.h"
#include "formats/gguf.h"
#include "formats/model_config.h"
#include "formats/safetensors.h"

namespace fathom::cli {
namespace {

using nlohmann::json;

constexpr size_t kMaxArrayItems = 64;  // longer GGUF arrays (vocabularies) are summarised

struct Report {
  std::string format;
  json metadata = json::object();
  json tensors = json::array();
  uint64_t bytes = 0;
  std::optional<ModelConfig> config;
  std::string config_error;
};

json tensor_json(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape, uint64_t bytes) {
  return json{{"name", name}, {"dtype", dtype}, {"shape", shape}, {"bytes", bytes}};
}

Status inspect_hf(const std::string& path, Report& r) {
  auto ck = TRY(SafetensorsCheckpoint::open(path));
  r.format = is_directory(path) ? "hf" : "safetensors";
  for (const auto& t : ck->tensors()) {
    const std::string dt(TRY(safetensors_dtype_name(t.entry->dtype)));
    r.tensors.push_back(tensor_json(t.entry->name, dt, t.entry->shape, t.entry->size));
    r.bytes += t.entry->size;
  }
  for (const auto& f : ck->files()) {
    for (const auto& [k, v] : f->metadata()) r.metadata[k] = v;
  }
  const std::string config = (std::filesystem::path(path) / "config.json").string();
  if (is_directory(path) && path_exists(config)) {
    auto c = load_hf_config(config);
    if (c.ok()) {
      r.config = *c;
    } else {
      return c.status();
    }
  }
  return {};
}

Status inspect_gguf(const std::string& path, Report& r) {
  auto g = TRY(GgufFile::open(path));
  r.format = "gguf";
  r.metadata["gguf.version"] = g->version();
  for (const auto& [k, v] : g->metadata()) r.metadata[k] = v.to_json(kMaxArrayItems);
  for (const auto& t : g->tensors()) {
    r.tensors.push_back(tensor_json(t.name, ggml_type_name(t.dtype), t.shape, t.size));
    r.bytes += t.size;
  }
  if (g->get("general.architecture") != nullptr) {
    auto c = model_config_from_gguf(*g);
    if (c.ok()) {
      r.config = *c;
    } else {
      r.config_error = c.status().to_string();
    }
  }
  return {};
}

Result<bool> is_gguf(const std::string& path) {
  if (is_directory(path)) return false;
  std::string head = TRY(read_file_prefix(path, 4));
  return head == "GGUF";
}

void print_text(const std::string& path, const Report& r) {
  std::printf("%s: %s, %zu tensors, %s\n", path.c_str(), r.format.c_str(), r.tensors.size(), format_bytes(r.bytes).c_str());
  if (!r.metadata.empty()) {
    std::printf("\nmetadata:\n");
    for (auto it = r.metadata.begin(); it != r.metadata.end(); ++it) {
      // Lossy: GGUF strings are bytes from the file and need not be UTF-8.
      std::string v = it.value().is_string()
                          ? it.value().get<std::string>()
                          : it.value().dump(-1, ' ', false, json::error_handler_t::replace);
      if (v.size() > 100) v = utf8_prefix(v, 97) + "...";
      std::printf("  %-48s %s\n", it.key().c_str(), v.c_str());
    }
  }
  std::printf("\ntensors:\n");
  for (const auto& t : r.tensors) {
    std::printf("  %-56s %-8s %-22s %s\n", t["name"].get<std::string>().c_str(), t["dtype"].get<std::string>().c_str(),
                t["shape"].dump().c_str(), format_bytes(t["bytes"].get<uint64_t>()).c_str());
  }
  if (r.config) {
    const ModelConfig& c = *r.config;
    const ParamCounts p = c.param_counts();
    std::printf("\nmodel: %s, %lld layers, hidden %lld, %lld heads, experts %lld routed (top-%lld) + %lld shared\n",
                c.architecture.c_str(), static_cast<long long>(c.num_hidden_layers), static_cast<long long>(c.hidden_size),
                static_cast<long long>(c.num_attention_heads), static_cast<long long>(c.n_routed_experts),
                static_cast<long long>(c.num_experts_per_tok), static_cast<long long>(c.n_shared_experts));
    std::printf("params: %.3fB total, %.3fB active per token, MTP %.3fB\n", static_cast<double>(p.total) / 1e9,
                static_cast<double>(p.active) / 1e9, static_cast<double>(p.mtp) / 1e9);
    std::printf("KV cache: %lld B/token in BF16 (%lld per layer), %lld B/token in FP8; a multi-head cache would need %lld per layer\n",
                static_cast<long long>(c.kv_bytes_per_token(DType::kBF16)),
                static_cast<long long>(c.kv_bytes_per_token_per_layer(DType::kBF16)),
                static_cast<long long>(c.kv_bytes_per_token(DType::kF8E4M3)),
                static_cast<long long>(c.mha_kv_bytes_per_token_per_layer()));
  } else if (!r.config_error.empty()) {
    std::printf("\nmodel config: %s\n", r.config_error.c_str());
  }
}

int run_inspect(int argc, char** argv) {
  std::string path;
  bool json_out = false;
  Args args(argv[0], "Show a checkpoint's format, metadata, tensors and model config (reads headers only).");
  args.usage("[options] PATH");
  args.positional("PATH", &path, "a .safetensors file, a .gguf file or a Hugging Face model directory");
  args.flag("--json", &json_out, "print one JSON object {format, metadata, tensors, config}");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  if (!path_exists(path)) return fail(args.command(), not_found("'{}' does not exist", path));
  Report r;
  auto gguf = is_gguf(path);
  if (!gguf.ok()) return fail(args.command(), gguf.status());
  Status st = *gguf ? inspect_gguf(path, r) : inspect_hf(path, r);
  if (!st.ok()) return fail(args.command(), st);
  if (json_out) {
    json j = {{"format", r.format}, {"metadata", r.metadata}, {"tensors", r.tensors}, {"total_bytes", r.bytes},
              {"n_tensors", r.tensors.size()}};
    j["config"] = r.config ? model_config_summary_json(*r.config) : json(nullptr);
    if (!r.config_error.empty()) j["config_error"] = r.config_error;
    print_json_line(j);  // lossy (print_json_line), as above
  } else {
    print_text(path, r);
  }
  return 0;
}

}  // namespace

FATHOM_COMMAND("inspect", "Show a checkpoint's tensors, metadata and model config", run_inspect);

}  // namespace fathom::cli
