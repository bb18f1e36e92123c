// Corpus documents -> the trainer's `fathom-tokens-v1` files (see eval.h, docs/MODEL.md). Chats
// are rendered by the same ChatTemplate the server uses; plain text is encoded untrusted.
#include <xxhash.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>

#include "base/fs.h"
#include "base/mmap.h"
#include "base/thread_pool.h"
#include "eval/eval.h"
#include "tokenizer/unicode.h"

namespace fathom::eval {
namespace {

// What a model should emit for an assistant turn with tool calls, in the form the server's
// ToolCallParser reads and DeepSeek-V3 models produce: every call, the calls block closed, EOS.
// (DeepSeek-V3's chat template itself never closes a single call; see docs/tokenizer.md.)
std::string tool_call_completion(const ChatMessage& m, const std::string& eos) {
  std::string out = "<｜tool▁calls▁begin｜>";
  for (size_t i = 0; i < m.tool_calls.size(); ++i) {
    const ToolCall& c = m.tool_calls[i];
    if (i) out += "\n";
    out += "<｜tool▁call▁begin｜>" + c.type + "<｜tool▁sep｜>" + c.name + "\n```json\n" + c.arguments +
           "\n```<｜tool▁call▁end｜>";
  }
  return out + "<｜tool▁calls▁end｜>" + eos;
}

Result<std::string> render_chat(const nlohmann::ordered_json& j, const ChatTemplate& tmpl,
                                std::string_view where) {
  auto messages = parse_chat_messages(j["messages"].dump());
  if (!messages.ok()) return messages.status().with_context(where);
  const bool completion = j.contains("render") && j["render"] == "tool_call_completion";
  if (completion &&
      (messages->empty() || messages->back().role != "assistant" || messages->back().tool_calls.empty()))
    return invalid_argument(
        "{}: \"render\": \"tool_call_completion\" needs a last assistant message with tool_calls", where);
  std::vector<ToolDefinition> tools;
  if (j.contains("tools") && !j["tools"].is_null()) {
    auto t = parse_tool_definitions(j["tools"].dump());
    if (!t.ok()) return t.status().with_context(where);
    tools = std::move(*t);
  }
  if (completion) {
    // The prompt the server builds for the turn (generation prompt included), then the reply.
    const ChatMessage last = messages->back();
    messages->pop_back();
    auto prompt = tmpl.render(*messages, tools, {.add_generation_prompt = true, .add_bos = false});
    if (!prompt.ok()) return prompt.status().with_context(where);
    return *prompt + tool_call_completion(last, "<｜end▁of▁sentence｜>");
  }
  auto text = tmpl.render(*messages, tools, {.add_generation_prompt = false, .add_bos = false});
  if (!text.ok()) return text.status().with_context(where);
  return std::move(*text);
}

Status write_bin(const std::string& path, const std::vector<TokenId>& ids) {
  static_assert(std::endian::native == std::endian::little, "fathom-tokens-v1 is little-endian");
  std::string bytes(ids.size() * sizeof(uint32_t), '\0');
  if (!ids.empty()) std::memcpy(bytes.data(), ids.data(), bytes.size());
  return write_file_atomic(path, bytes);
}

}  // namespace

Result<Document> parse_document(std::string_view line, const ChatTemplate& tmpl, std::string_view where) {
  // ordered: tool schemas keep their key order, as the server renders them.
  auto j = nlohmann::ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return invalid_argument("{}: not a JSON object (expected {{\"text\": ...}} or {{\"messages\": ...}})",
                            where);
  if (j.contains("text")) {
    if (!j["text"].is_string()) return invalid_argument("{}: \"text\" must be a string", where);
    return Document{DocKind::kText, j["text"].get<std::string>()};
  }
  if (j.contains("messages")) {
    if (!j["messages"].is_array()) return invalid_argument("{}: \"messages\" must be an array", where);
    return Document{DocKind::kChat, TRY(render_chat(j, tmpl, where))};
  }
  return invalid_argument("{}: the object has neither \"text\" nor \"messages\"", where);
}

Result<std::vector<Document>> read_documents(const std::string& path, const ChatTemplate& tmpl) {
  auto file = TRY(MappedFile::open(path));
  const std::string_view all(reinterpret_cast<const char*>(file->data()), file->size());
  const size_t valid = tok::utf8_valid_prefix(all);
  if (valid != all.size()) {
    return invalid_argument("{}: not valid UTF-8 at byte offset {} (the corpus must be UTF-8 text)", path,
                            valid);
  }
  std::vector<std::string_view> lines;
  for (size_t pos = 0; pos < all.size();) {
    size_t end = all.find('\n', pos);
    if (end == std::string_view::npos) end = all.size();
    lines.push_back(all.substr(pos, end - pos));
    pos = end + 1;
  }
  std::vector<Document> docs(lines.size());
  std::vector<Status> errors(lines.size());
  default_pool().parallel_for(static_cast<int64_t>(lines.size()), 256, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      if (lines[i].find_first_not_of(" \t\r") == std::string_view::npos) continue;
      auto d = parse_document(lines[i], tmpl, fmt::format("{}:{}", path, i + 1));
      if (d.ok()) {
        docs[i] = std::move(*d);
      } else {
        errors[i] = d.status();
      }
    }
  });
  std::vector<Document> out;
  out.reserve(docs.size());
  for (size_t i = 0; i < docs.size(); ++i) {
    if (!errors[i].ok()) return errors[i];
    if (lines[i].find_first_not_of(" \t\r") == std::string_view::npos) continue;
    out.push_back(std::move(docs[i]));
  }
  return out;
}

Status encode_document(const Tokenizer& tok, const Document& doc, std::vector<TokenId>* out) {
  if (tok.bos_id() == kNoToken || tok.eos_id() == kNoToken)
    return invalid_argument(
        "the tokenizer has no BOS or EOS token (train it with DeepSeek-V3's special tokens)");
  out->push_back(tok.bos_id());
  // A rendered chat's markers are control tokens (as the server's prompt builder encodes them); plain
  // text is a user's text: marker strings in it stay text.
  TRY(tok.encode_into(doc.text, {.add_special = false, .untrusted = doc.kind == DocKind::kText}, out));
  if (doc.kind == DocKind::kText) out->push_back(tok.eos_id());
  return {};
}

void loss_mask(const Tokenizer& tok, DocKind kind, std::span<const TokenId> ids, std::vector<uint8_t>* mask) {
  mask->reserve(mask->size() + ids.size());
  if (kind == DocKind::kText) {
    for (size_t i = 0; i < ids.size(); ++i) mask->push_back(ids[i] == tok.bos_id() && i == 0 ? 0 : 1);
    return;
  }
  const ChatTokenIds& c = tok.chat_tokens();
  bool on = false;  // inside text the assistant writes
  for (const TokenId id : ids) {
    uint8_t m = on ? 1 : 0;
    if (id == c.assistant) {
      m = 0;  // the server's generation prompt
      on = true;
    } else if (id == c.user) {
      m = 0;
      on = false;
    } else if (id == c.tool_outputs_begin) {
      on = false;  // scored when the assistant's call turn ends with it (m as set above)
    } else if (id == c.tool_outputs_end) {
      m = 0;  // written by the server after the client's tool results
      on = true;
    } else if (id == tok.eos_id()) {
      on = false;
    }
    mask->push_back(m);
  }
}

Result<TokenizeCorpusResult> tokenize_corpus(const Tokenizer& tok, const TokenizeCorpusParams& p) {
  if (p.inputs.empty()) return invalid_argument("no input files");
  if (!(p.val_fraction >= 0 && p.val_fraction < 1))
    return invalid_argument("val_fraction {} is outside [0, 1)", p.val_fraction);
  const ChatTemplate tmpl = TRY(ChatTemplate::for_tokenizer(tok));
  TokenizeCorpusResult r;
  std::vector<TokenId> train, val;
  std::vector<uint8_t> train_mask, val_mask;
  const uint64_t threshold = static_cast<uint64_t>(p.val_fraction * 1e6);
  for (const std::string& path : p.inputs) {
    const std::vector<Document> docs = TRY(read_documents(path, tmpl));
    std::vector<std::vector<TokenId>> ids(docs.size());
    std::vector<Status> errors(docs.size());
    default_pool().parallel_for(static_cast<int64_t>(docs.size()), 64, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) errors[i] = encode_document(tok, docs[i], &ids[i]);
    });
    for (size_t i = 0; i < docs.size(); ++i) {
      if (!errors[i].ok()) return errors[i].with_context(fmt::format("{}: document {}", path, i + 1));
      const bool is_val =
          XXH3_64bits_withSeed(docs[i].text.data(), docs[i].text.size(), p.seed) % 1000000 < threshold;
      std::vector<TokenId>& dst = is_val ? val : train;
      dst.insert(dst.end(), ids[i].begin(), ids[i].end());
      std::vector<uint8_t>& mask = is_val ? val_mask : train_mask;
      const size_t before = mask.size();
      loss_mask(tok, docs[i].kind, ids[i], &mask);
      (is_val ? r.n_val_targets : r.n_train_targets) +=
          std::count(mask.begin() + static_cast<ptrdiff_t>(before), mask.end(), uint8_t{1});
      (is_val ? r.n_val_docs : r.n_train_docs) += 1;
      (is_val ? r.n_val_tokens : r.n_train_tokens) += static_cast<int64_t>(ids[i].size());
      const bool chat = docs[i].kind == DocKind::kChat;
      (chat ? r.n_chat_docs : r.n_text_docs) += 1;
      (chat ? r.n_chat_tokens : r.n_text_tokens) += static_cast<int64_t>(ids[i].size());
      r.input_bytes += static_cast<int64_t>(docs[i].text.size());
    }
  }
  if (r.n_train_docs == 0) return invalid_argument("no documents went to train.bin (empty inputs?)");
  TRY(write_bin(p.out_dir + "/train.bin", train));
  TRY(write_bin(p.out_dir + "/val.bin", val));
  if (p.loss_mask) {
    TRY(write_file_atomic(p.out_dir + "/train.mask",
                          std::string_view(reinterpret_cast<const char*>(train_mask.data()), train_mask.size())));
    TRY(write_file_atomic(p.out_dir + "/val.mask",
                          std::string_view(reinterpret_cast<const char*>(val_mask.data()), val_mask.size())));
  } else {
    std::error_code ec;  // a mask from an earlier build would not match these tokens
    std::filesystem::remove(p.out_dir + "/train.mask", ec);
    std::filesystem::remove(p.out_dir + "/val.mask", ec);
  }
  r.meta = {{"format", "fathom-tokens-v1"},
            {"vocab_size", tok.vocab_size()},
            {"bos_id", tok.bos_id()},
            {"eos_id", tok.eos_id()},
            {"n_train_tokens", r.n_train_tokens},
            {"n_val_tokens", r.n_val_tokens},
            {"n_train_docs", r.n_train_docs},
            {"n_val_docs", r.n_val_docs},
            {"n_chat_tokens", r.n_chat_tokens},
            {"n_text_tokens", r.n_text_tokens},
            {"val_fraction", p.val_fraction},
            {"split_seed", p.seed},
            {"dtype", "uint32-le"}};
  if (p.loss_mask) {
    r.meta["loss_mask"] = "uint8";
    r.meta["n_train_targets"] = r.n_train_targets;
    r.meta["n_val_targets"] = r.n_val_targets;
  }
  TRY(write_file_atomic(p.out_dir + "/meta.json", r.meta.dump(1) + "\n"));
  return r;
}

}  // namespace fathom::eval
