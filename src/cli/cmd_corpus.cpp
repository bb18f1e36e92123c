// `fathom corpus render|tokenize`: the training-data steps of scripts/corpus/build.sh. `render`
// turns JSONL documents (plain text or OpenAI chats) into text with the server's chat template;
// `tokenize` writes the trainer's fathom-tokens-v1 files (train.bin, val.bin, meta.json).
// The corpus generators themselves are scripts (scripts/corpus/); see docs/MODEL.md.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>

#include "base/fs.h"
#include "base/timer.h"
#include "cli/args.h"
#include "cli/command.h"
#include "eval/eval.h"
#include "tokenizer/tokenizer.h"

namespace fathom::cli {
namespace {

struct RenderOptions {
  std::string tokenizer = "builtin";
  std::string out;
  bool plain = false;
  std::vector<std::string> inputs;
};

// --plain: the text a tokenizer is trained on: control-token strings become line breaks (they are
// added tokens, never learned as merges).
void strip_specials(std::string* text, const std::vector<std::string>& specials) {
  for (const std::string& sp : specials) {
    for (size_t pos = text->find(sp); pos != std::string::npos; pos = text->find(sp, pos + 1)) {
      text->replace(pos, sp.size(), "\n");
    }
  }
}

Status render(const RenderOptions& o) {
  if (o.inputs.empty())
    return invalid_argument("no input files (fathom corpus render --out FILE IN.jsonl...)");
  if (o.out.empty()) return invalid_argument("--out is required");
  auto tok =
      o.tokenizer == "builtin" ? TRY(Tokenizer::from_builtin()) : TRY(Tokenizer::from_files(o.tokenizer));
  const ChatTemplate tmpl = TRY(ChatTemplate::for_tokenizer(*tok));
  const std::vector<std::string> specials = deepseek_v3_special_tokens();
  std::string out;
  int64_t n = 0;
  for (const std::string& path : o.inputs) {
    std::vector<eval::Document> docs = TRY(eval::read_documents(path, tmpl));
    for (eval::Document& d : docs) {
      if (o.plain) {
        strip_specials(&d.text, specials);
        out += d.text;
        out += "\n\n";
      } else {
        out += nlohmann::json({{"text", d.text}}).dump() + "\n";
      }
      ++n;
    }
  }
  TRY(write_file_atomic(o.out, out));
  std::fprintf(stderr, "rendered %lld documents (%zu bytes) to %s\n", static_cast<long long>(n), out.size(),
               o.out.c_str());
  return {};
}

int run_render(int argc, char** argv) {
  RenderOptions o;
  Args args(argv[0],
            "Render JSONL documents ({\"text\"} or OpenAI {\"messages\",\"tools\"}) with the server's chat "
            "template.");
  args.usage("--out FILE [--plain] IN.jsonl...");
  args.option("--tokenizer", &o.tokenizer,
              "tokenizer (its chat template): tokenizer.json, its directory or 'builtin'", "PATH");
  args.option("--out", &o.out, "output: JSONL of {\"text\"} (default) or plain text (--plain)", "FILE");
  args.flag("--plain", &o.plain, "plain text for tokenizer training: control-token strings become newlines");
  args.rest("IN.jsonl", &o.inputs, "JSONL documents");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  if (Status s = render(o); !s.ok()) return fail(args.command(), s);
  return 0;
}

struct TokenizeOptions {
  std::string tokenizer;
  std::string out;
  double val_fraction = 0.015;
  int64_t seed = 0;
  bool loss_mask = false;
  bool json = false;
  std::vector<std::string> inputs;
};

Status tokenize(const TokenizeOptions& o) {
  if (o.tokenizer.empty())
    return invalid_argument("--tokenizer is required (the trained tokenizer.json or its directory)");
  if (o.out.empty()) return invalid_argument("--out DIR is required");
  auto tok = TRY(Tokenizer::from_files(o.tokenizer));
  Timer t;
  const auto r = TRY(eval::tokenize_corpus(*tok, {.inputs = o.inputs,
                                                  .out_dir = o.out,
                                                  .val_fraction = o.val_fraction,
                                                  .seed = static_cast<uint64_t>(o.seed),
                                                  .loss_mask = o.loss_mask}));
  const double s = t.elapsed_s();
  nlohmann::json j = r.meta;
  j["seconds"] = s;
  j["input_bytes"] = r.input_bytes;
  j["n_text_docs"] = r.n_text_docs;
  j["n_chat_docs"] = r.n_chat_docs;
  if (o.json) {
    print_json_line(j.dump());
  } else {
    std::printf(
        "%lld train tokens (%lld documents), %lld val tokens (%lld documents); chat %.1f%%, text %.1f%% of "
        "tokens; %.1f s\nwrote %s/train.bin, val.bin, meta.json\n",
        static_cast<long long>(r.n_train_tokens), static_cast<long long>(r.n_train_docs),
        static_cast<long long>(r.n_val_tokens), static_cast<long long>(r.n_val_docs),
        100.0 * double(r.n_chat_tokens) / double(r.n_chat_tokens + r.n_text_tokens),
        100.0 * double(r.n_text_tokens) / double(r.n_chat_tokens + r.n_text_tokens), s, o.out.c_str());
  }
  return {};
}

int run_tokenize(int argc, char** argv) {
  TokenizeOptions o;
  Args args(argv[0], "Tokenize JSONL documents into the trainer's fathom-tokens-v1 files.");
  args.usage("--tokenizer DIR --out DIR IN.jsonl...");
  args.option("--tokenizer", &o.tokenizer, "tokenizer.json or its directory", "PATH");
  args.option("--out", &o.out, "directory for train.bin, val.bin, meta.json", "DIR");
  args.option("--val-fraction", &o.val_fraction, "share of documents held out in val.bin");
  args.option("--seed", &o.seed, "seed of the train/val split hash");
  args.flag("--loss-mask", &o.loss_mask,
            "also write train.mask / val.mask: chats score only what the assistant writes");
  args.flag("--json", &o.json, "print one JSON object (meta.json plus timings)");
  args.rest("IN.jsonl", &o.inputs, "JSONL documents: {\"text\"} or {\"messages\",\"tools\"}");
  args.epilog(
      "Every document starts with BOS; plain text ends with EOS (chats end with EOS already).\n"
      "A file that is not valid UTF-8 is an error naming the file and the byte offset.");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  if (Status s = tokenize(o); !s.ok()) return fail(args.command(), s);
  return 0;
}

int run_corpus(int argc, char** argv) {
  const char* usage =
      "usage: fathom corpus render --out FILE [--plain] IN.jsonl...       render documents with the chat "
      "template\n"
      "       fathom corpus tokenize --tokenizer DIR --out DIR IN.jsonl...  write train.bin, val.bin, "
      "meta.json\n";
  return run_subcommands(argc, argv, usage, {{"render", run_render}, {"tokenize", run_tokenize}});
}

}  // namespace

FATHOM_COMMAND("corpus", "Build training data: render chats, tokenize into train.bin/val.bin", run_corpus);

}  // namespace fathom::cli
