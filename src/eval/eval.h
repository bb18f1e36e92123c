// Training data and model evaluation for Fathom's own model (docs/MODEL.md):
//  * the corpus: JSONL documents (plain text or OpenAI-shaped chats) rendered with DeepSeek-V3's
//    chat template exactly as `fathom serve` renders a request, tokenized into the trainer's
//    `fathom-tokens-v1` format (train.bin / val.bin of little-endian uint32 ids + meta.json);
//  * the unigram baseline: cross-entropy of val.bin under train.bin's unigram distribution;
//  * the tool-use score: held-out OpenAI requests sent to an OpenAI-compatible endpoint, replies
//    scored by whether they call the expected tool with arguments that parse.
// Not a trainer and not a server: it reads and writes files and talks HTTP as a client.
// Thread safety: free functions; tokenize_corpus uses the default thread pool internally.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace fathom::eval {

// ---- Corpus documents --------------------------------------------------------------------------
//
// One document per JSONL line: {"text": "..."} (plain text, encoded as untrusted text: control-token
// strings in it stay text) or {"messages": [...], "tools": [...]} (OpenAI shapes, rendered with the
// chat template without a trailing generation prompt and without the BOS string; its control
// markers become control tokens, exactly as the server's prompt builder encodes them). With
// "render": "tool_call_completion" the last message must be an assistant turn with tool_calls: the
// document is the prompt the server builds for the messages before it (generation prompt included)
// followed by the reply a model should give: the calls, <｜tool▁calls▁end｜> and EOS.

enum class DocKind : uint8_t { kText, kChat };

struct Document {
  DocKind kind = DocKind::kText;
  std::string text;  // plain text, or the rendered chat (control-token strings included)
};

// Parses one JSONL line; errors name `where` ("FILE:LINE").
Result<Document> parse_document(std::string_view line, const ChatTemplate& tmpl, std::string_view where);

// Every line of `path` as documents. A file that is not valid UTF-8 is an error naming the file
// and the byte offset; blank lines are skipped.
Result<std::vector<Document>> read_documents(const std::string& path, const ChatTemplate& tmpl);

// Token ids of one document: bos_id, the text's ids, and eos_id for plain text (a rendered chat
// already ends with EOS after each assistant turn).
Status encode_document(const Tokenizer& tok, const Document& doc, std::vector<TokenId>* out);

// Which tokens of an encoded document (encode_document's ids) are training targets, one byte per
// token (1: the model is trained to predict it; 0: context only), appended to `mask`. Plain text:
// every token but BOS. A chat: only what the assistant writes (the tokens after each
// <｜Assistant｜> up to and including its EOS, the <｜tool▁outputs▁begin｜> a call turn ends with in
// the template, and the answer after <｜tool▁outputs▁end｜>); the system prompt, tool list, user
// turns, tool outputs and the markers the server writes itself are context, as in supervised
// fine-tuning. A small model then spends its capacity on the replies (tool names copied from
// the tool list, arguments from the request) instead of on predicting prompts it is always given.
void loss_mask(const Tokenizer& tok, DocKind kind, std::span<const TokenId> ids, std::vector<uint8_t>* mask);

struct TokenizeCorpusParams {
  std::vector<std::string> inputs;  // JSONL files, in order
  std::string out_dir;              // gets train.bin, val.bin, meta.json
  double val_fraction = 0.015;      // share of documents (by a hash of their text) in val.bin
  uint64_t seed = 0;                // the split hash's seed
  bool loss_mask = false;           // also write train.mask / val.mask (loss_mask() per document)
};

struct TokenizeCorpusResult {
  int64_t n_train_docs = 0, n_val_docs = 0;
  int64_t n_train_tokens = 0, n_val_tokens = 0;
  int64_t n_train_targets = 0, n_val_targets = 0;  // tokens whose mask byte is 1
  int64_t n_chat_docs = 0, n_text_docs = 0;
  int64_t n_chat_tokens = 0, n_text_tokens = 0;
  int64_t input_bytes = 0;
  nlohmann::json meta;  // what meta.json holds
};

// Writes OUT/train.bin, OUT/val.bin (uint32 LE ids; every document starts with bos_id), with
// params.loss_mask OUT/train.mask, OUT/val.mask (loss_mask's bytes, one per token), and
// OUT/meta.json {"format":"fathom-tokens-v1","vocab_size","bos_id","eos_id","n_train_tokens",
// "n_val_tokens", ...; with masks "loss_mask":"uint8","n_train_targets","n_val_targets"}. Without
// masks stale mask files in OUT are removed. A document goes to val when a seeded hash of its text falls below
// val_fraction, so identical documents never straddle the split. Deterministic.
Result<TokenizeCorpusResult> tokenize_corpus(const Tokenizer& tok, const TokenizeCorpusParams& params);

// ---- Unigram baseline ---------------------------------------------------------------------------

struct UnigramResult {
  double cross_entropy_nats = 0;  // mean -ln p_train(id) over val, add-one smoothed over the vocab
  double val_entropy_nats = 0;    // entropy of val's own unigram distribution (a lower bound)
  int64_t n_train = 0, n_val = 0;
  int64_t n_val_unseen = 0;  // val tokens whose id never occurs in train
};
// With masks (one byte per token, as train.mask / val.mask; empty spans: every token counts), only
// tokens whose byte is 1 count on either side: the baseline for the loss the trainer reports.
Result<UnigramResult> unigram_baseline(std::span<const int32_t> train, std::span<const int32_t> val,
                                       int64_t vocab_size, std::span<const uint8_t> train_mask = {},
                                       std::span<const uint8_t> val_mask = {});

// ---- Tool-use evaluation ------------------------------------------------------------------------

struct HeldoutRequest {
  nlohmann::ordered_json messages;  // OpenAI messages
  nlohmann::ordered_json tools;     // OpenAI tools
  std::string expected_tool;
};
// heldout_tools.jsonl: {"messages", "tools", "expected_tool", ...} per line; errors name the line.
Result<std::vector<HeldoutRequest>> read_heldout(const std::string& path);

enum class ToolOutcome : uint8_t {
  kCorrect,     // a tool call naming the expected tool, arguments a JSON object
  kBadArgs,     // the expected tool, but the arguments are not a JSON object
  kWrongTool,   // a tool call, but the first call names another tool
  kNoToolCall,  // no tool call in the message
};
std::string_view outcome_name(ToolOutcome o);

// Scores one reply message ({"role":"assistant","content":...,"tool_calls":[...]}). The first
// tool call decides; `detail` says what was wrong (for failure examples).
ToolOutcome score_tool_reply(const nlohmann::ordered_json& message, std::string_view expected_tool,
                             std::string* detail);

struct ToolEvalParams {
  std::string url;  // base URL of an OpenAI-compatible API, e.g. http://127.0.0.1:8000/v1
  std::string model = "default";
  std::string api_key;
  int64_t max_tokens = 256;
  int timeout_s = 600;
  size_t examples_max = 10;  // failure examples kept
};

struct ToolEvalResult {
  int64_t n = 0, n_correct = 0, n_any_call = 0, n_bad_args = 0, n_wrong_tool = 0, n_no_call = 0;
  int64_t n_errors = 0;  // requests the endpoint failed (counted as failures)
  double seconds = 0;
  nlohmann::ordered_json examples = nlohmann::ordered_json::array();  // failures: request text, expected, got
  double correct_fraction() const { return n ? double(n_correct) / double(n) : 0; }
  double any_call_fraction() const { return n ? double(n_any_call) / double(n) : 0; }
};

// Sends each request (temperature 0, non-streaming, tools as given) and scores the replies.
Result<ToolEvalResult> evaluate_tools(std::span<const HeldoutRequest> requests, const ToolEvalParams& params);

}  // namespace fathom::eval
