// `fathom logits`: the logits of the last position of a token sequence (ids used verbatim), for
// cross-checking against other engines.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "base/strings.h"
#include "cli/args.h"
#include "cli/command.h"
#include "model/model.h"

namespace fathom::cli {
namespace {

int run_logits(int argc, char** argv) {
  std::string model_path, tokens_text, mode = "prefill", kv = "bf16";
  int64_t top = 10, ep = 1;
  std::string ep_dispatch = "f32", ep_combine = "f32";
  bool ep_fast = false;
  bool json_out = false;
  Args args(argv[0], "Print the logits of the last position of --tokens (no BOS added).");
  args.usage("--model PATH --tokens 1,2,3 [--top K] [--json]");
  args.option("--model", &model_path, "Hugging Face model directory or GGUF file", "PATH");
  args.model_load_options();
  args.option("--tokens", &tokens_text, "comma-separated token ids, used verbatim", "IDS");
  args.option("--top", &top, "how many of the largest logits to list (text output)");
  args.option("--mode", &mode, "prefill (naive MLA) or decode (token by token, absorbed MLA)", "MODE");
  args.option("--kv-dtype", &kv, "bf16 or fp8 latent cache", "DTYPE");
  args.option("--ep", &ep, "expert parallelism over N ranks: run as `mpirun -np N fathom logits --ep N ...`", "N");
  args.option("--ep-dispatch", &ep_dispatch, "--ep rows sent to the experts: f32 (exact), bf16 or fp8", "FORMAT");
  args.option("--ep-combine", &ep_combine, "--ep expert outputs sent back: f32 (exact) or bf16", "FORMAT");
  args.flag("--ep-fast", &ep_fast, "--ep at DeepEP's granularity (one row per token and rank; not bit-exact)");
  args.flag("--json", &json_out, "print {\"logits\": [...]} with the full vector");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  auto ids64 = parse_int_list(tokens_text, "--tokens");
  if (!ids64.ok()) return fail(args.command(), ids64.status());
  if (ids64->empty()) return fail(args.command(), invalid_argument("--tokens is empty"));
  if (mode != "prefill" && mode != "decode") return fail(args.command(), invalid_argument("--mode '{}' is not prefill or decode", mode));
  auto kv_dtype = parse_mla_kv_dtype(kv);
  if (!kv_dtype.ok()) return fail(args.command(), kv_dtype.status());
  if (ep < 1 || ep > 4096) return fail(args.command(), invalid_argument("--ep {} must be in [1, 4096]", ep));
  ModelOptions mo;
  mo.progress = !json_out && is_primary_rank();
  mo.ep_size = static_cast<int>(ep);
  mo.ep_dispatch_format = ep_dispatch;
  mo.ep_combine_format = ep_combine;
  mo.ep_exact = !ep_fast;
  auto model = Model::load(model_path, mo);
  if (!model.ok()) return fail(args.command(), model.status());
  std::vector<int32_t> ids;
  for (int64_t v : *ids64) {
    if (v < 0 || v >= (*model)->config().vocab_size) {
      return fail(args.command(), out_of_range("token id {} is outside the vocabulary of {}", v, (*model)->config().vocab_size));
    }
    ids.push_back(static_cast<int32_t>(v));
  }
  if (static_cast<int64_t>(ids.size()) > (*model)->max_context()) {
    return fail(args.command(), out_of_range("{} tokens exceed the context limit of {}", ids.size(), (*model)->max_context()));
  }
  auto logits = run_sequence_logits(**model, ids, mode == "prefill" ? RunMode::kPrefill : RunMode::kTokenByToken, *kv_dtype);
  if (!logits.ok()) return fail(args.command(), logits.status());
  const int64_t V = (*model)->config().vocab_size;
  const float* last = logits->data() + (static_cast<int64_t>(ids.size()) - 1) * V;
  if (json_out) {
    nlohmann::json j;
    j["logits"] = std::vector<float>(last, last + V);
    print_json_line(j.dump());
    return 0;
  }
  if (!is_primary_rank()) return 0;  // under --ep every rank has the same logits; rank 0 prints
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  const size_t k = static_cast<size_t>(std::clamp<int64_t>(top, 1, V));
  std::partial_sort(order.begin(), order.begin() + static_cast<int64_t>(k), order.end(),
                    [&](int32_t a, int32_t b) { return last[a] > last[b]; });
  for (size_t i = 0; i < k; ++i) {
    auto text = (*model)->tokenizer().token_bytes(order[i]);
    std::printf("%8d %12.6f  %s\n", order[i], last[order[i]], text.ok() ? nlohmann::json(*text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str() : "?");
  }
  return 0;
}

}  // namespace

FATHOM_COMMAND("logits", "Print the last-position logits of a token sequence", run_logits);

}  // namespace fathom::cli
