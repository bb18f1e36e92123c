// `fathom bench kvstore`: time to first token of a long prompt served three ways by the engine
// with the KV-cache storage tier (engine/kv_tier.h):
//   cold    a new prompt, prefilled from scratch (its pages are written through to the store);
//   store   the same prompt on a restarted engine (empty memory cache): pages read from the store
//           and imported instead of recomputed;
//   memory  the same prompt again on that engine: pages attached from memory.
// Ratios: cold / store (what the tier saves) and the store read's effective bandwidth next to
// this machine's measured memory bandwidth. A storage server is started in process on a
// temporary target unless --store names a running one.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "base/rng.h"
#include "base/timer.h"
#include "cli/args.h"
#include "cli/bench.h"
#include "engine/engine.h"
#include "kernels/roofline.h"
#include "model/model.h"
#include "storage/storage.h"

namespace fathom::cli {
namespace {

struct Ttft {
  double seconds = 0;
  int32_t first_token = -1;
  int64_t cached_tokens = 0;
};

// Submits one prompt (one output token) and waits for it.
Result<Ttft> first_token(Engine& engine, const std::vector<int32_t>& prompt) {
  GenerationRequest req;
  req.prompt = prompt;
  req.max_tokens = 1;
  req.ignore_eos = true;
  req.sampling.temperature = 0;
  auto stream = TRY(engine.submit(std::move(req)));
  Ttft t;
  while (true) {
    auto ev = stream->next(600000);
    if (!ev) return timeout_error("bench kvstore: no token in 600 s");
    if (ev->first_token_seconds >= 0) t.seconds = ev->first_token_seconds;
    if (!ev->tokens.empty() && t.first_token < 0) t.first_token = ev->tokens[0];
    if (ev->finish != FinishReason::kNone) {
      if (ev->finish == FinishReason::kError) return ev->error;
      t.cached_tokens = ev->usage.cached_tokens;
      return t;
    }
  }
}

struct Figures {
  double cold_s = 0, store_s = 0, memory_s = 0;
  int64_t store_cached_tokens = 0, pages_imported = 0, bytes_read = 0;
  bool same_token = true;
};

Status one_run(Model& model, const EngineOptions& eo, const std::vector<int32_t>& prompt, Figures* f) {
  Ttft cold, store, memory;
  {
    auto e = TRY(Engine::create(model, eo));
    cold = TRY(first_token(*e, prompt));
  }  // destroyed: the write queue is flushed
  auto e = TRY(Engine::create(model, eo));
  store = TRY(first_token(*e, prompt));
  memory = TRY(first_token(*e, prompt));
  const KvTierStats st = e->metrics().store;
  f->cold_s += cold.seconds;
  f->store_s += store.seconds;
  f->memory_s += memory.seconds;
  f->store_cached_tokens += store.cached_tokens;
  f->pages_imported += st.pages_imported;
  f->bytes_read += st.bytes_read;
  f->same_token =
      f->same_token && cold.first_token == store.first_token && store.first_token == memory.first_token;
  return {};
}

int run_bench_kvstore(int argc, char** argv) {
  std::string model_path, store_addr, kv = "bf16";
  int64_t prompt_tokens = 1024, runs = 3, seed = 1;
  bool json_out = false;
  Args args(argv[0],
            "Time to first token of a long prompt: cold, read back from the KV store, and from memory.");
  args.usage("--model PATH [--store HOST:PORT] [--prompt-tokens N] [--runs N] [--json]");
  args.option("--model", &model_path, "Hugging Face model directory or GGUF file", "PATH");
  args.model_load_options();
  args.option("--store", &store_addr,
              "a running `fathom store server` (default: one in process on a temp dir)", "HOST:PORT");
  args.option("--prompt-tokens", &prompt_tokens, "prompt length (random token ids, a new prompt per run)");
  args.option("--runs", &runs, "prompts measured (figures are means)");
  args.option("--kv-dtype", &kv, "bf16 or fp8 latent cache", "DTYPE");
  args.option("--seed", &seed, "seed of the random prompts");
  args.flag("--json", &json_out, "print one JSON object with raw figures and ratios");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  if (model_path.empty()) return fail(args.command(), invalid_argument("--model is required"));
  if (prompt_tokens < 65 || runs < 1)
    return fail(args.command(), invalid_argument("--prompt-tokens must be > 64, --runs >= 1"));
  auto kvd = parse_mla_kv_dtype(kv);
  if (!kvd.ok()) return fail(args.command(), kvd.status());
  const MemoryBandwidth bw = measure_memory_bandwidth(default_pool());
  std::unique_ptr<storage::StorageServer> local;
  const std::string target =
      (std::filesystem::temp_directory_path() / ("fathom-bench-kvstore-" + std::to_string(::getpid())))
          .string();
  if (store_addr.empty()) {
    storage::ServerParams sp;
    sp.targets = {storage::TargetParams{target, 0}};
    sp.listen = "127.0.0.1:0";
    auto s = storage::StorageServer::start(sp);
    if (!s.ok()) return fail(args.command(), s.status());
    local = std::move(*s);
    store_addr = local->address();
  }
  ModelOptions mo;
  mo.max_context = prompt_tokens + 16;
  mo.max_sequences = 2;
  mo.max_batch_tokens = 512 + 2;
  mo.load_mtp = false;  // no speculation here; an MTP layer in the cache would be left unwritten
  auto loaded = Model::load(model_path, mo);
  if (!loaded.ok()) return fail(args.command(), loaded.status());
  Model& model = **loaded;
  EngineOptions eo;
  eo.max_running = 1;
  eo.prefill_chunk = 512;
  eo.kv_dtype = *kvd;
  eo.speculative = false;
  const KvCacheOptions ko = model.kv_cache_options(*kvd, 0, 2);
  eo.kv_cache_bytes = static_cast<uint64_t>((prompt_tokens / ko.format.page_tokens + 4) * 2 *
                                            ko.format.page_bytes() * ko.n_layers);
  eo.kv_store.server = store_addr;
  Rng rng(static_cast<uint64_t>(seed) ^ static_cast<uint64_t>(::getpid())
                                            << 20);  // new prompts each invocation
  Figures f;
  for (int64_t r = 0; r < runs; ++r) {
    std::vector<int32_t> prompt(static_cast<size_t>(prompt_tokens));
    for (auto& t : prompt)
      t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(model.tokenizer().vocab_size())));
    if (Status st = one_run(model, eo, prompt, &f); !st.ok()) return fail(args.command(), st);
  }
  if (local) local->stop();
  std::error_code ec;
  std::filesystem::remove_all(target, ec);
  const double n = static_cast<double>(runs);
  const double cold = f.cold_s / n, store = f.store_s / n, memory = f.memory_s / n;
  const double read_s = std::max(1e-9, store - memory);
  const double store_gbs = static_cast<double>(f.bytes_read) / n / read_s / 1e9;
  std::printf("prompt %lld tokens, %lld runs, store %s\n", static_cast<long long>(prompt_tokens),
              static_cast<long long>(runs), local ? "in process" : store_addr.c_str());
  std::printf("ttft cold %.1f ms | from store %.1f ms (%.2fx faster) | from memory %.1f ms\n", cold * 1e3,
              store * 1e3, cold / store, memory * 1e3);
  std::printf(
      "store load: %.1f MB in %.1f ms over the memory-warm time = %.2f GB/s (memory bandwidth %.1f GB/s)\n",
      static_cast<double>(f.bytes_read) / n / 1e6, read_s * 1e3, store_gbs, bw.read_gbs);
  if (!f.same_token) std::printf("WARNING: the first token differs between cold and warm runs\n");
  if (json_out) {
    nlohmann::json j = {{"model", model_path},
                        {"kv_dtype", kv},
                        {"prompt_tokens", prompt_tokens},
                        {"runs", runs},
                        {"store", local ? "in-process" : store_addr},
                        {"ttft_cold_s", cold},
                        {"ttft_store_s", store},
                        {"ttft_memory_s", memory},
                        {"store_cached_tokens", f.store_cached_tokens / runs},
                        {"store_pages_imported", f.pages_imported / runs},
                        {"store_bytes_read", f.bytes_read / runs},
                        {"store_load_gbs", store_gbs},
                        {"memory_bandwidth_gbs", bw.read_gbs},
                        {"cold_over_store", cold / store},
                        {"store_load_fraction_of_memory_bw", store_gbs / bw.read_gbs},
                        {"same_first_token", f.same_token}};
    print_json_line(j.dump());
  }
  return f.same_token ? 0 : 1;
}

}  // namespace

FATHOM_BENCH("kvstore", "TTFT of a long prompt: cold vs read back from the KV store vs memory",
             run_bench_kvstore);

}  // namespace fathom::cli
