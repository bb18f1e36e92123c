// `fathom generate`: load a model, run a prompt, stream the continuation to stdout; prefill and
// decode speeds go to stderr at the end.
#include <cstdio>
#include <optional>

#include "base/progress.h"
#include "base/timer.h"
#include "cli/args.h"
#include "cli/command.h"
#include "engine/sampler.h"
#include "model/model.h"
#include "tokenizer/chat_template.h"

namespace fathom::cli {
namespace {

struct GenerateOptions {
  std::string model;
  std::optional<std::string> prompt, chat;
  int64_t max_tokens = 128;
  double temperature = 0.0;
  double top_p = 1.0;
  int64_t top_k = 0;
  std::optional<int64_t> seed;
  std::string kv_dtype = "bf16";
  int64_t max_context = 0;
  bool raw = false;
  int64_t ep = 1;
  std::string ep_dispatch = "f32", ep_combine = "f32";
  bool ep_fast = false;
};

Result<std::vector<int32_t>> prompt_tokens(const Model& model, const GenerateOptions& o) {
  const Tokenizer& tok = model.tokenizer();
  if (o.chat) {
    ChatTemplate tmpl = TRY(ChatTemplate::for_tokenizer(tok, ChatFormat::kDeepSeekV3));
    std::vector<ChatMessage> msgs = {ChatMessage{"user", *o.chat, {}, {}}};
    const std::string text = TRY(tmpl.render(msgs));
    return tok.encode(text, {.add_special = false});
  }
  return tok.encode(*o.prompt, {.add_special = true});
}

Status generate(const GenerateOptions& o) {
  if (o.prompt.has_value() == o.chat.has_value()) return invalid_argument("give exactly one of --prompt and --chat");
  if (o.max_tokens < 0) return invalid_argument("--max-tokens {} must not be negative", o.max_tokens);
  ModelOptions mo;
  mo.max_context = o.max_context;
  if (o.ep < 1 || o.ep > 4096) return invalid_argument("--ep {} must be in [1, 4096]", o.ep);
  mo.ep_size = static_cast<int>(o.ep);
  mo.ep_dispatch_format = o.ep_dispatch;
  mo.ep_combine_format = o.ep_combine;
  mo.ep_exact = !o.ep_fast;
  // Under --ep every rank computes the same tokens; rank 0 alone prints.
  const bool quiet = !is_primary_rank();
  mo.progress = !quiet;
  auto model = TRY(Model::load(o.model, mo));
  const Tokenizer& tok = model->tokenizer();
  const std::vector<int32_t> prompt = TRY(prompt_tokens(*model, o));
  if (prompt.empty()) return invalid_argument("the prompt encodes to no tokens");
  const int64_t total = static_cast<int64_t>(prompt.size()) + o.max_tokens;
  if (static_cast<int64_t>(prompt.size()) >= model->max_context()) {
    return out_of_range("the prompt has {} tokens but the context limit is {}", prompt.size(), model->max_context());
  }
  SamplingParams sp;
  sp.temperature = static_cast<float>(o.temperature);
  sp.top_p = static_cast<float>(o.top_p);
  sp.top_k = static_cast<int32_t>(o.top_k);
  if (o.seed) sp.seed = static_cast<uint64_t>(*o.seed);
  TRY(validate_sampling(sp));
  const MlaKvDType kv = TRY(parse_mla_kv_dtype(o.kv_dtype));
  KvCacheOptions ko = model->kv_cache_options(kv, 0, 1);
  const int64_t pages = std::min(total, model->max_context()) / ko.format.page_tokens + 2;
  ko.capacity_bytes = static_cast<uint64_t>(pages * ko.format.page_bytes() * ko.n_layers);
  auto cache = TRY(KvCache::create(ko));
  const SeqId seq = TRY(cache->add_sequence());
  const int64_t vocab = model->config().vocab_size;
  std::vector<float> logits(static_cast<size_t>(vocab));
  Sampler sampler(sp, static_cast<int32_t>(vocab));
  sampler.add_prompt(prompt);
  // Prefill in chunks.
  Timer prefill_timer;
  const int64_t chunk = model->options().max_batch_tokens;
  for (int64_t p = 0; p < static_cast<int64_t>(prompt.size()); p += chunk) {
    const int64_t n = std::min<int64_t>(chunk, static_cast<int64_t>(prompt.size()) - p);
    const auto part = std::span<const int32_t>(prompt).subspan(static_cast<size_t>(p), static_cast<size_t>(n));
    TRY(cache->append(seq, part));
    const SeqBatch b{seq, p, n, false};
    TRY(model->forward(std::span<const SeqBatch>(&b, 1), part, *cache, logits.data()));
  }
  const double prefill_s = prefill_timer.elapsed_s();
  StreamDecoder stream(tok, {.skip_special = !o.raw});
  std::string text;
  Timer decode_timer;
  int64_t generated = 0;
  int64_t pos = static_cast<int64_t>(prompt.size());
  while (generated < o.max_tokens && pos < model->max_context()) {
    const SampleResult r = TRY(sampler.sample(logits.data()));
    ++generated;
    sampler.add_generated(r.token);
    if (r.token == tok.eos_id()) break;
    // A chat reply ends at any chat marker (they are not flagged special, so the decoder would
    // print them): as the server does (docs/server.md, "Responses"). --raw shows everything.
    if (o.chat && !o.raw && tok.token_type(r.token) == TokenType::kControl && !tok.is_special(r.token)) break;
    text.clear();
    TRY(stream.push(r.token, &text));
    if (!quiet) {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    }
    if (generated == o.max_tokens) break;
    const int32_t t = r.token;
    TRY(cache->append(seq, std::span<const int32_t>(&t, 1)));
    const SeqBatch b{seq, pos, 1, false};
    TRY(model->forward(std::span<const SeqBatch>(&b, 1), std::span<const int32_t>(&t, 1), *cache, logits.data()));
    ++pos;
  }
  text.clear();
  stream.finish(&text);
  if (quiet) return {};
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  const double decode_s = decode_timer.elapsed_s();
  std::fprintf(stderr, "prefill: %zu tokens in %.3f s (%.2f tokens/s); decode: %lld tokens in %.3f s (%.2f tokens/s)\n",
               prompt.size(), prefill_s, static_cast<double>(prompt.size()) / prefill_s,
               static_cast<long long>(generated), decode_s, generated > 1 ? static_cast<double>(generated - 1) / decode_s : 0.0);
  return {};
}

int run_generate(int argc, char** argv) {
  GenerateOptions o;
  Args args(argv[0], "Run a prompt through a model and stream the continuation (speeds on stderr).");
  args.usage("--model PATH (--prompt TEXT | --chat TEXT) [options]");
  args.option("--model", &o.model, "Hugging Face model directory or GGUF file", "PATH");
  args.model_load_options();
  args.option("--prompt", &o.prompt, "raw text (BOS added as the tokenizer says)", "TEXT");
  args.option("--chat", &o.chat,
              "a user message, rendered with the chat template; the reply ends at EOS or a chat marker",
              "TEXT");
  args.option("--max-tokens", &o.max_tokens, "tokens to generate");
  args.option("--temperature", &o.temperature, "0 = greedy");
  args.option("--top-p", &o.top_p, "nucleus sampling");
  args.option("--top-k", &o.top_k, "0 = off");
  args.option("--seed", &o.seed, "sampling seed");
  args.option("--kv-dtype", &o.kv_dtype, "bf16 or fp8 latent cache", "DTYPE");
  args.option("--max-context", &o.max_context, "context limit (default min(max_position_embeddings, 32768))");
  args.flag("--raw", &o.raw, "print special tokens too");
  args.option("--ep", &o.ep, "expert parallelism over N ranks: run as `mpirun -np N fathom generate --ep N ...`", "N");
  args.option("--ep-dispatch", &o.ep_dispatch, "--ep rows sent to the experts: f32 (exact), bf16 or fp8", "FORMAT");
  args.option("--ep-combine", &o.ep_combine, "--ep expert outputs sent back: f32 (exact) or bf16", "FORMAT");
  args.flag("--ep-fast", &o.ep_fast, "--ep at DeepEP's granularity (one row per token and rank; not bit-exact)");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  if (o.model.empty()) return fail(args.command(), invalid_argument("--model is required"));
  Status st = generate(o);
  if (!st.ok()) return fail(args.command(), st);
  return 0;
}

}  // namespace

FATHOM_COMMAND("generate", "Generate text from a prompt with a model", run_generate);

}  // namespace fathom::cli
