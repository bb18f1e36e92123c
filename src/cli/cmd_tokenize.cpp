// `fathom tokenize`: encode stdin byte for byte (no trimming) into token ids, or decode a JSON
// array of ids back into text. The tokenizer is a tokenizer.json (or its directory) or "builtin".
#include <nlohmann/json.hpp>

#include <unistd.h>
#include <cstdio>
#include <string>

#include "cli/args.h"
#include "cli/command.h"
#include "tokenizer/tokenizer.h"

namespace fathom::cli {
namespace {

struct TokenizeOptions {
  std::string tokenizer;
  std::string config;
  bool untrusted = false;
  bool add_special = false;
  bool json = false;
  bool decode = false;
  bool skip_special = false;
  bool show = false;
};

Result<std::string> read_stdin() {
  std::string data;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(STDIN_FILENO, buf, sizeof(buf));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status(errno, "read stdin");
    }
    data.append(buf, static_cast<size_t>(n));
  }
  return data;
}

Status write_stdout(std::string_view s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(STDOUT_FILENO, s.data() + done, s.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status(errno, "write stdout");
    }
    done += static_cast<size_t>(n);
  }
  return {};
}

Result<std::vector<TokenId>> parse_ids(std::string_view text) {
  auto j = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_array())
    return invalid_argument("--decode: stdin must be a JSON array of token ids");
  std::vector<TokenId> ids;
  ids.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_number_integer()) return invalid_argument("--decode: element {} is not an integer", i);
    const int64_t v = j[i].get<int64_t>();
    if (v < INT32_MIN || v > INT32_MAX)
      return out_of_range("--decode: element {} ({}) is not a token id", i, v);
    ids.push_back(static_cast<TokenId>(v));
  }
  return ids;
}

Status run(const TokenizeOptions& o) {
  if (o.tokenizer.empty())
    return invalid_argument("--tokenizer is required (a tokenizer.json, its directory, or 'builtin')");
  auto tok = o.tokenizer == "builtin" ? TRY(Tokenizer::from_builtin())
                                      : TRY(Tokenizer::from_files(o.tokenizer, o.config));
  const std::string input = TRY(read_stdin());
  if (o.decode) {
    const std::vector<TokenId> ids = TRY(parse_ids(input));
    const std::string text = TRY(tok->decode(ids, {.skip_special = o.skip_special}));
    return write_stdout(text);
  }
  auto ids = tok->encode(input, {.add_special = o.add_special, .untrusted = o.untrusted});
  if (!ids.ok()) return ids.status().with_context("stdin");
  std::string out;
  if (o.show) {
    for (TokenId id : *ids) {
      const std::string bytes = TRY(tok->token_bytes(id));
      out +=
          fmt::format("{}\t{}\n", id,
                      nlohmann::json(bytes).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    }
  } else if (o.json) {
    out = nlohmann::json(*ids).dump() + "\n";
  } else {
    for (size_t i = 0; i < ids->size(); ++i) out += fmt::format("{}{}", i ? " " : "", (*ids)[i]);
    out += "\n";
  }
  return write_stdout(out);
}

int run_tokenize(int argc, char** argv) {
  TokenizeOptions o;
  Args args(argv[0], "Encode stdin into token ids, or decode a JSON array of ids (--decode).");
  args.usage("--tokenizer PATH [options] < input");
  args.option("--tokenizer", &o.tokenizer, "tokenizer.json, a directory holding it, or 'builtin'", "PATH");
  args.option("--config", &o.config, "tokenizer_config.json (default: beside tokenizer.json)", "PATH");
  args.flag("--untrusted", &o.untrusted, "special-token strings in the input are plain text");
  args.flag("--add-special", &o.add_special, "add BOS/EOS as the tokenizer config says");
  args.flag("--json", &o.json, "print the ids as one JSON array");
  args.flag("--show", &o.show, "print one line per token: id and its text as a JSON string");
  args.flag("--decode", &o.decode, "read a JSON array of ids from stdin and print the text");
  args.flag("--skip-special", &o.skip_special, "with --decode: drop special tokens");
  args.epilog(
      "Encodes stdin exactly as read (no trimming, no added newline). Without --add-special no BOS/EOS is\n"
      "added. Invalid UTF-8 on stdin is an error naming the byte offset.");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  if (Status s = run(o); !s.ok()) return fail(args.command(), s);
  return 0;
}

}  // namespace

FATHOM_COMMAND("tokenize", "Encode text to token ids or decode ids to text", run_tokenize);

}  // namespace fathom::cli
