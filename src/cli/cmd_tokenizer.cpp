// `fathom tokenizer train|info`: train a byte-level BPE tokenizer from text files (written as a
// standard tokenizer.json + tokenizer_config.json), or describe a tokenizer.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>

#include "base/fs.h"
#include "base/mmap.h"
#include "base/timer.h"
#include "cli/args.h"
#include "cli/command.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace fathom::cli {
namespace {

struct TrainOptions {
  int64_t vocab_size = 4096;
  int64_t min_frequency = 2;
  std::string out = "tokenizer.json";
  std::string config_out;  // default: tokenizer_config.json beside --out
  std::string pre = "deepseek-v3";
  std::vector<std::string> special;
  bool no_bos = false;
  bool json = false;
  std::vector<std::string> files;
};

Status train(const TrainOptions& o) {
  if (o.files.empty()) return invalid_argument("no input files (fathom tokenizer train [options] FILE...)");
  if (o.vocab_size <= 0 || o.vocab_size > (int64_t{1} << 24)) {
    return invalid_argument("--vocab-size {} is out of range (1..16777216)", o.vocab_size);
  }
  Timer t;
  std::vector<std::unique_ptr<MappedFile>> maps;
  std::vector<std::string_view> texts;
  int64_t bytes = 0;
  for (const std::string& f : o.files) {
    auto m = MappedFile::open(f);
    if (!m.ok()) return m.status().with_context("input");
    texts.emplace_back(reinterpret_cast<const char*>((*m)->data()), (*m)->size());
    bytes += static_cast<int64_t>((*m)->size());
    maps.push_back(std::move(*m));
  }
  BpeTrainParams p;
  p.vocab_size = static_cast<int32_t>(o.vocab_size);
  p.min_frequency = o.min_frequency;
  p.pre = o.pre;
  p.special_tokens = o.special;
  p.add_bos = !o.no_bos;
  auto r = train_bpe(texts, p);
  if (!r.ok()) {
    // Name the file for per-text errors ("train: text 2: ...").
    const std::string& msg = r.status().message();
    for (size_t i = 0; i < o.files.size(); ++i) {
      if (msg.find(fmt::format("text {}:", i)) != std::string::npos)
        return r.status().with_context(o.files[i]);
    }
    return r.status();
  }
  std::string config_out = o.config_out;
  if (config_out.empty()) {
    const size_t slash = o.out.rfind('/');
    config_out =
        (slash == std::string::npos ? std::string() : o.out.substr(0, slash + 1)) + "tokenizer_config.json";
  }
  TRY(write_file_atomic(o.out, r->tokenizer_json));
  TRY(write_file_atomic(config_out, r->tokenizer_config_json));
  // Prove the output loads before reporting success.
  auto tok = Tokenizer::from_json(r->tokenizer_json, r->tokenizer_config_json);
  if (!tok.ok()) return tok.status().with_context("the trained tokenizer does not load");
  const double s = t.elapsed_s();
  if (o.json) {
    nlohmann::json j = {{"out", o.out},
                        {"config_out", config_out},
                        {"vocab_size", (*tok)->vocab_size()},
                        {"merges", r->n_merges},
                        {"words", r->n_words},
                        {"unique_words", r->n_unique_words},
                        {"input_bytes", bytes},
                        {"seconds", s}};
    print_json_line(j.dump());
  } else {
    std::printf(
        "trained %d tokens (%d merges) from %lld bytes, %lld words (%lld distinct) in %.2f s\nwrote %s and "
        "%s\n",
        (*tok)->vocab_size(), r->n_merges, static_cast<long long>(bytes), static_cast<long long>(r->n_words),
        static_cast<long long>(r->n_unique_words), s, o.out.c_str(), config_out.c_str());
  }
  return {};
}

int run_train(int argc, char** argv) {
  TrainOptions o;
  Args args(argv[0],
            "Train a byte-level BPE tokenizer (tokenizer.json + tokenizer_config.json) from text files.");
  args.usage("--vocab-size N --out tokenizer.json FILE...");
  args.option("--vocab-size", &o.vocab_size, "total tokens: 256 bytes + merges + special tokens");
  args.option("--min-frequency", &o.min_frequency, "never merge a pair seen fewer times");
  args.option("--out", &o.out, "tokenizer.json to write", "PATH");
  args.option("--config-out", &o.config_out, "tokenizer_config.json to write (default: beside --out)",
              "PATH");
  args.option(
      "--pre", &o.pre,
      "pre-tokenizer: deepseek-v3, deepseek-llm, deepseek-coder, gpt2, llama-bpe (llama.cpp names), or "
      "fathom-isolated (letters, punctuation and spaces each apart, so a word is the same tokens "
      "after a space or a quote; GGUF exports of it are for Fathom only)",
      "NAME");
  args.multi("--special", &o.special,
             "special token (repeat; first three are BOS, EOS, PAD; default DeepSeek-V3's)", "TOKEN");
  args.flag("--no-bos", &o.no_bos, "do not add BOS when encoding with special tokens");
  args.flag("--json", &o.json, "print one JSON object");
  args.rest("FILE", &o.files, "UTF-8 text files to learn from");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  if (Status s = train(o); !s.ok()) return fail(args.command(), s);
  return 0;
}

int run_info(int argc, char** argv) {
  std::string path;
  bool json = false;
  Args args(argv[0], "Describe a tokenizer: vocabulary size, special tokens, pre-tokenizer name.");
  args.positional("PATH", &path, "tokenizer.json, its directory, or 'builtin'");
  args.flag("--json", &json, "print one JSON object");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  auto tok = path == "builtin" ? Tokenizer::from_builtin() : Tokenizer::from_files(path);
  if (!tok.ok()) return fail(args.command(), tok.status());
  const Tokenizer& t = **tok;
  auto data = t.vocab_data();
  const std::string pre = data.ok() ? data->pre : "(not a llama.cpp pre-tokenizer)";
  nlohmann::json j = {{"vocab_size", t.vocab_size()},
                      {"bos_id", t.bos_id()},
                      {"eos_id", t.eos_id()},
                      {"pad_id", t.pad_id()},
                      {"add_bos", t.add_bos()},
                      {"add_eos", t.add_eos()},
                      {"pre", pre},
                      {"chat_template", t.chat_template().empty()                          ? "none"
                                        : t.chat_template() == deepseek_v3_chat_template() ? "deepseek-v3"
                                                                                           : "other"}};
  if (json) {
    print_json_line(j.dump());
  } else {
    for (auto it = j.begin(); it != j.end(); ++it)
      std::printf("%-14s %s\n", it.key().c_str(), it.value().dump().c_str());
  }
  return 0;
}

Result<std::string> read_all_stdin() {
  std::string data;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), stdin)) > 0) data.append(buf, n);
  if (std::ferror(stdin)) return io_error("read stdin failed");
  return data;
}

// stdin: {"messages": [...], "tools": [...], "add_generation_prompt": true} (OpenAI shapes).
Status render(const std::string& path, bool ids, bool json) {
  auto tok = path == "builtin" ? TRY(Tokenizer::from_builtin()) : TRY(Tokenizer::from_files(path));
  const std::string input = TRY(read_all_stdin());
  auto j =
      nlohmann::ordered_json::parse(input, nullptr, false);  // ordered: tool schemas keep their key order
  if (j.is_discarded() || !j.is_object() || !j.contains("messages")) {
    return invalid_argument(
        "stdin must be a JSON object with \"messages\" (and optionally \"tools\", "
        "\"add_generation_prompt\")");
  }
  const auto messages = TRY(parse_chat_messages(j["messages"].dump()));
  std::vector<ToolDefinition> tools;
  if (j.contains("tools") && !j["tools"].is_null()) tools = TRY(parse_tool_definitions(j["tools"].dump()));
  const ChatTemplate tmpl = TRY(ChatTemplate::for_tokenizer(*tok));
  ChatRenderOptions o;
  if (j.contains("add_generation_prompt") && j["add_generation_prompt"].is_boolean()) {
    o.add_generation_prompt = j["add_generation_prompt"].get<bool>();
  }
  const std::string prompt = TRY(tmpl.render(messages, tools, o));
  if (!ids && !json) {
    std::fwrite(prompt.data(), 1, prompt.size(), stdout);
    return {};
  }
  nlohmann::json out = {{"prompt", prompt}};
  if (ids) out["ids"] = TRY(tok->encode(prompt));
  print_json_line(out);
  return {};
}

int run_render(int argc, char** argv) {
  std::string path;
  bool ids = false, json = false;
  Args args(argv[0],
            "Render a chat (OpenAI messages and tools as JSON on stdin) with DeepSeek-V3's template.");
  args.positional("PATH", &path, "tokenizer.json, its directory, or 'builtin'");
  args.flag("--ids", &ids, "print {\"prompt\", \"ids\"} as one JSON object");
  args.flag("--json", &json, "print {\"prompt\"} as one JSON object");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  if (Status s = render(path, ids, json); !s.ok()) return fail(args.command(), s);
  return 0;
}

// stdin: generated text in DeepSeek's format -> {"content", "tool_calls", "error"} (OpenAI shapes).
int run_parse(int argc, char** argv) {
  Args args(argv[0], "Parse generated text (stdin) in DeepSeek's tool-call format into OpenAI tool_calls.");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  auto input = read_all_stdin();
  if (!input.ok()) return fail(args.command(), input.status());
  const ParsedToolCalls p = parse_tool_calls(*input);
  nlohmann::json calls = nlohmann::json::array();
  for (const ToolCall& c : p.tool_calls) {
    calls.push_back(
        {{"id", c.id}, {"type", c.type}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  }
  nlohmann::json out = {{"content", p.content}, {"tool_calls", calls}};
  if (!p.error.ok()) out["error"] = p.error.message();
  print_json_line(out);
  return 0;
}

int run_tokenizer(int argc, char** argv) {
  const char* usage =
      "usage: fathom tokenizer train [options] FILE...   train a byte-level BPE tokenizer\n"
      "       fathom tokenizer info PATH                 vocabulary size, special tokens, pre-tokenizer\n"
      "       fathom tokenizer render PATH < chat.json   render a chat with DeepSeek-V3's template\n"
      "       fathom tokenizer parse < generated.txt     DeepSeek tool calls -> OpenAI tool_calls\n";
  return run_subcommands(argc, argv, usage, {{"train", run_train}, {"info", run_info}, {"render", run_render}, {"parse", run_parse}});
}

}  // namespace

FATHOM_COMMAND("tokenizer", "Train, inspect a tokenizer; render chats; parse tool calls", run_tokenizer);

}  // namespace fathom::cli
