// One-pass tokenizer.json parser: see json_sax.h. A SAX handler forwards every event to
// nlohmann's DOM builder except inside model.vocab and model.merges, which it decodes itself.
#include "tokenizer/json_sax.h"

namespace fathom::tok {

namespace {

using Json = nlohmann::json;

class Handler {
 public:
  explicit Handler(ParsedTokenizerJson* out) : out_(out), dom_(out->dom, /*allow_exceptions=*/false) {}

  const Status& status() const { return status_; }

  bool null() {
    return value([&] { return dom_.null(); }, "null");
  }
  bool boolean(bool v) {
    return value([&] { return dom_.boolean(v); }, "a boolean");
  }
  bool number_float(Json::number_float_t v, const Json::string_t& s) {
    return value([&] { return dom_.number_float(v, s); }, "a float");
  }
  bool binary(Json::binary_t& v) {
    return value([&] { return dom_.binary(v); }, "binary");
  }
  bool number_integer(Json::number_integer_t v) {
    if (mode_ == Mode::kVocab) return add_vocab(v);
    return value([&] { return dom_.number_integer(v); }, "an integer");
  }
  bool number_unsigned(Json::number_unsigned_t v) {
    if (mode_ == Mode::kVocab)
      return add_vocab(v > static_cast<uint64_t>(INT64_MAX) ? -1 : static_cast<int64_t>(v));
    return value([&] { return dom_.number_unsigned(v); }, "an integer");
  }
  bool string(Json::string_t& s) {
    if (mode_ == Mode::kMerges) return add_merge_string(s);
    if (mode_ == Mode::kMergePair) {
      if (pair_.size() >= 2)
        return fail("tokenizer.json: model.merges[{}] must be \"a b\" or [\"a\", \"b\"]", n_merges_);
      pair_.push_back(std::move(s));
      return true;
    }
    return value([&] { return dom_.string(s); }, "a string");
  }

  bool start_object(std::size_t n) {
    if (mode_ != Mode::kForward) return unexpected("an object");
    if (pending_ == "vocab") {
      pending_.clear();
      mode_ = Mode::kVocab;
      out_->vocab.emplace();
      out_->vocab->reserve(n == static_cast<std::size_t>(-1) ? 1024 : n);
      return true;
    }
    if (!flush_pending()) return false;
    ++depth_;
    keys_.resize(static_cast<size_t>(depth_) + 1);
    return dom_.start_object(n);
  }
  bool key(Json::string_t& k) {
    if (mode_ == Mode::kVocab) {
      key_ = std::move(k);
      return true;
    }
    if (depth_ == 2 && keys_[1] == "model" && (k == "vocab" || k == "merges")) {
      pending_ = k;  // decided by the next event: captured if it opens the expected container
      return true;
    }
    keys_[static_cast<size_t>(depth_)] = k;
    return dom_.key(k);
  }
  bool end_object() {
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kForward;
      return true;
    }
    --depth_;
    return dom_.end_object();
  }
  bool start_array(std::size_t n) {
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kMergePair;
      pair_.clear();
      return true;
    }
    if (mode_ != Mode::kForward) return unexpected("an array");
    if (pending_ == "merges") {
      pending_.clear();
      mode_ = Mode::kMerges;
      out_->merges.emplace();
      out_->merges->reserve(n == static_cast<std::size_t>(-1) ? 1024 : n);
      return true;
    }
    if (!flush_pending()) return false;
    ++depth_;
    keys_.resize(static_cast<size_t>(depth_) + 1);
    return dom_.start_array(n);
  }
  bool end_array() {
    if (mode_ == Mode::kMergePair) {
      if (pair_.size() != 2)
        return fail("tokenizer.json: model.merges[{}] must be \"a b\" or [\"a\", \"b\"]", n_merges_);
      out_->merges->emplace_back(std::move(pair_[0]), std::move(pair_[1]));
      ++n_merges_;
      mode_ = Mode::kMerges;
      return true;
    }
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kForward;
      return true;
    }
    --depth_;
    return dom_.end_array();
  }
  bool parse_error(std::size_t position, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& e) {
    return fail("tokenizer.json: not valid JSON (at byte {}): {}", position, e.what());
  }

 private:
  enum class Mode { kForward, kVocab, kMerges, kMergePair };

  template <typename... Args>
  bool fail(fmt::format_string<Args...> f, Args&&... args) {
    if (status_.ok()) status_ = invalid_argument(f, std::forward<Args>(args)...);
    return false;
  }
  bool unexpected(const char* what) {
    if (mode_ == Mode::kVocab)
      return fail("tokenizer.json: model.vocab['{}'] must be an integer id, not {}", key_, what);
    return fail("tokenizer.json: model.merges[{}] must be \"a b\" or [\"a\", \"b\"], not {}", n_merges_,
                what);
  }
  bool flush_pending() {
    if (pending_.empty()) return true;
    keys_[static_cast<size_t>(depth_)] = pending_;
    std::string k = std::move(pending_);
    pending_.clear();
    return dom_.key(k);
  }
  template <typename F>
  bool value(F&& forward, const char* what) {
    if (mode_ != Mode::kForward) return unexpected(what);
    if (!flush_pending()) return false;
    return forward();
  }
  bool add_vocab(int64_t v) {
    if (v < 0 || v >= (int64_t{1} << 30))
      return fail("tokenizer.json: model.vocab['{}'] has id {} out of range", key_, v);
    out_->vocab->emplace(std::move(key_), static_cast<Id>(v));
    return true;
  }
  bool add_merge_string(const std::string& s) {
    const size_t sp = s.find(' ');
    if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
      return fail("tokenizer.json: model.merges[{}] '{}' is not two tokens separated by one space", n_merges_,
                  s);
    }
    out_->merges->emplace_back(s.substr(0, sp), s.substr(sp + 1));
    ++n_merges_;
    return true;
  }

  ParsedTokenizerJson* out_;
  nlohmann::detail::json_sax_dom_parser<Json> dom_;
  Status status_;
  Mode mode_ = Mode::kForward;
  int depth_ = 0;
  std::vector<std::string> keys_{1};  // the current key at each object depth
  std::string pending_, key_;
  std::vector<std::string> pair_;
  size_t n_merges_ = 0;
};

}  // namespace

Result<ParsedTokenizerJson> parse_tokenizer_json_text(std::string_view text) {
  ParsedTokenizerJson out;
  Handler h(&out);
  const bool ok = Json::sax_parse(text.begin(), text.end(), &h);
  if (!h.status().ok()) return h.status();
  if (!ok) return invalid_argument("tokenizer.json: not valid JSON");
  return out;
}

}  // namespace fathom::tok
