// Normalizers, pre-tokenizers and decoders: see pipeline.h. Split semantics follow the Rust
// `tokenizers` crate: a pattern yields (range, is_match) segments covering the text, a behavior
// merges or drops them, and empty pieces vanish.
#include "tokenizer/pipeline.h"

#include "tokenizer/unicode.h"

namespace fathom::tok {

namespace {

using Matches = std::vector<std::pair<size_t, size_t>>;

// Scratch buffers per pre-tokenizer step depth, reused across calls on this thread.
struct Scratch {
  std::vector<Matches> matches;
  std::vector<std::vector<Segment>> segments;
  void ensure(size_t depth) {
    if (matches.size() <= depth) matches.resize(depth + 1);
    if (segments.size() <= depth) segments.resize(depth + 1);
  }
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// (range, is_match) segments covering text from sorted, non-overlapping matches.
void segments_from_matches(const Matches& matches, size_t n, bool invert, std::vector<Segment>* out) {
  out->clear();
  if (n == 0) {
    out->push_back({0, 0, false});
    return;
  }
  size_t prev = 0;
  for (auto [b, e] : matches) {
    if (prev != b) out->push_back({prev, b, invert});
    out->push_back({b, e, !invert});
    prev = e;
  }
  if (prev != n) out->push_back({prev, n, invert});
}

// Each character for which pred holds is one match.
template <typename Pred>
void char_matches(std::string_view text, Pred pred, Matches* out) {
  out->clear();
  size_t i = 0;
  while (i < text.size()) {
    char32_t cp;
    const size_t len = static_cast<size_t>(utf8_decode(text.data() + i, text.size() - i, &cp));
    if (pred(cp)) out->emplace_back(i, i + len);
    i += len;
  }
}

Status replace_all(const Pattern& pattern, std::string_view content, std::string_view in, std::string* out) {
  Matches m;
  TRY(pattern.find(in, &m));
  out->clear();
  size_t prev = 0;
  for (auto [b, e] : m) {
    out->append(in.substr(prev, b - prev));
    out->append(content);
    prev = e;
  }
  out->append(in.substr(prev));
  return {};
}

}  // namespace

Status Pattern::find(std::string_view text, std::vector<std::pair<size_t, size_t>>* out) const {
  out->clear();
  if (regex) return regex->for_each_match(text, [&](size_t b, size_t e) { out->emplace_back(b, e); });
  if (literal.empty()) return {};
  size_t pos = 0;
  while ((pos = text.find(literal, pos)) != std::string_view::npos) {
    out->emplace_back(pos, pos + literal.size());
    pos += literal.size();
  }
  return {};
}

std::string Pattern::describe() const {
  return regex ? "regex '" + regex->pattern() + "'" : "'" + literal + "'";
}

Status Normalizer::apply(std::string_view in, std::string* out) const {
  std::string cur(in), next;
  for (const NormalizerStep& s : steps) {
    switch (s.kind) {
      case NormalizerKind::kNFC:
        cur = TRY(normalize_unicode(cur, NormalForm::kNFC));
        break;
      case NormalizerKind::kNFD:
        cur = TRY(normalize_unicode(cur, NormalForm::kNFD));
        break;
      case NormalizerKind::kNFKC:
        cur = TRY(normalize_unicode(cur, NormalForm::kNFKC));
        break;
      case NormalizerKind::kNFKD:
        cur = TRY(normalize_unicode(cur, NormalForm::kNFKD));
        break;
      case NormalizerKind::kLowercase:
        cur = lowercase(cur);
        break;
      case NormalizerKind::kReplace:
        TRY(replace_all(s.pattern, s.content, cur, &next));
        cur.swap(next);
        break;
      case NormalizerKind::kPrepend:
        if (!cur.empty()) cur.insert(0, s.content);
        break;
      case NormalizerKind::kStrip:
        cur = std::string(strip_white_space(cur, s.strip_left, s.strip_right));
        break;
    }
  }
  *out = std::move(cur);
  return {};
}

void apply_split_behavior(SplitBehavior behavior, std::vector<Segment>* segments) {
  std::vector<Segment>& in = *segments;
  if (behavior == SplitBehavior::kIsolated) {
    for (Segment& s : in) s.is_match = false;  // is_match now means "remove"
    return;
  }
  if (behavior == SplitBehavior::kRemoved) return;
  std::vector<Segment> out;
  out.reserve(in.size());
  bool previous_match = false;
  if (behavior == SplitBehavior::kMergedWithNext) {
    for (size_t k = in.size(); k-- > 0;) {
      const Segment& s = in[k];
      if (s.is_match && !previous_match && !out.empty()) {
        out.back().begin = s.begin;
      } else {
        out.push_back({s.begin, s.end, false});
      }
      previous_match = s.is_match;
    }
    in.assign(out.rbegin(), out.rend());
    return;
  }
  for (const Segment& s : in) {
    const bool merge =
        behavior == SplitBehavior::kContiguous ? s.is_match == previous_match : s.is_match && !previous_match;
    if (merge && !out.empty()) {
      out.back().end = s.end;
    } else {
      out.push_back({s.begin, s.end, false});
    }
    previous_match = s.is_match;
  }
  in.swap(out);
}

namespace {

struct PreTokenizerRun {
  const PreTokenizer& pre;
  FunctionRef<Status(std::string_view)> emit;

  Status emit_segments(size_t depth, std::string_view text, bool first) {
    // Copy out: deeper steps reuse other depths only, but the vector may be reallocated by
    // scratch().ensure() at a deeper level; index by position instead of iterators.
    const size_t n = scratch().segments[depth].size();
    for (size_t k = 0; k < n; ++k) {
      const Segment s = scratch().segments[depth][k];
      if (s.is_match || s.end == s.begin) continue;  // removed or empty
      TRY(step(depth + 1, text.substr(s.begin, s.end - s.begin), first && s.begin == 0));
    }
    return {};
  }

  Status split(size_t depth, std::string_view text, bool first, const Matches* matches, bool invert,
               SplitBehavior behavior) {
    std::vector<Segment>& segs = scratch().segments[depth];
    segments_from_matches(*matches, text.size(), invert, &segs);
    apply_split_behavior(behavior, &segs);
    return emit_segments(depth, text, first);
  }

  Status step(size_t depth, std::string_view text, bool first) {
    if (depth == pre.steps.size()) return emit(text);
    scratch().ensure(depth);
    const PreTokenizerStep& s = pre.steps[depth];
    Matches* m = &scratch().matches[depth];
    switch (s.kind) {
      case PreKind::kSplit:
        TRY(s.pattern.find(text, m));
        return split(depth, text, first, m, s.invert, s.behavior);
      case PreKind::kWhitespace:
        TRY(s.pattern.find(text, m));
        return split(depth, text, first, m, /*invert=*/true, SplitBehavior::kRemoved);
      case PreKind::kWhitespaceSplit:
        char_matches(text, is_white_space, m);
        return split(depth, text, first, m, false, SplitBehavior::kRemoved);
      case PreKind::kPunctuation:
        char_matches(text, is_punctuation, m);
        return split(depth, text, first, m, false, s.behavior);
      case PreKind::kDigits:
        char_matches(text, is_numeric, m);
        return split(depth, text, first, m, false,
                     s.individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous);
      case PreKind::kByteLevel:
        return byte_level(depth, text, first, s);
      case PreKind::kMetaspace:
        return metaspace(depth, text, first, s);
    }
    return internal_error("unknown pre-tokenizer step");
  }

  Status byte_level(size_t depth, std::string_view text, bool first, const PreTokenizerStep& s) {
    std::string prefixed;
    if (s.add_prefix_space && (text.empty() || text[0] != ' ')) {
      prefixed.reserve(text.size() + 1);
      prefixed.push_back(' ');
      prefixed.append(text);
      text = prefixed;
    }
    if (!s.use_regex) return step(depth + 1, text, first);
    Matches* m = &scratch().matches[depth];
    TRY(s.pattern.find(text, m));
    return split(depth, text, first, m, false, SplitBehavior::kIsolated);
  }

  Status metaspace(size_t depth, std::string_view text, bool first, const PreTokenizerStep& s) {
    std::string replaced;
    replaced.reserve(text.size() + s.replacement.size());
    for (char c : text) {
      if (c == ' ') {
        replaced += s.replacement;
      } else {
        replaced.push_back(c);
      }
    }
    const bool starts = replaced.compare(0, s.replacement.size(), s.replacement) == 0;
    if (!starts && (s.prepend_scheme == PrependScheme::kAlways ||
                    (s.prepend_scheme == PrependScheme::kFirst && first))) {
      replaced.insert(0, s.replacement);
    }
    if (!s.split) return step(depth + 1, replaced, first);
    Matches* m = &scratch().matches[depth];
    m->clear();
    for (size_t pos = 0; (pos = replaced.find(s.replacement, pos)) != std::string::npos;
         pos += s.replacement.size()) {
      m->emplace_back(pos, pos + s.replacement.size());
    }
    return split(depth, replaced, first, m, false, SplitBehavior::kMergedWithNext);
  }
};

}  // namespace

Status PreTokenizer::run(std::string_view text, bool first,
                         FunctionRef<Status(std::string_view)> emit) const {
  PreTokenizerRun r{*this, emit};
  return r.step(0, text, first);
}

Decoder::State Decoder::initial_state() const {
  State st;
  st.left.resize(steps.size(), 0);
  for (size_t k = 0; k < steps.size(); ++k) {
    if (steps[k].kind == DecoderKind::kStrip && steps[k].after_fuse) st.left[k] = steps[k].start;
  }
  return st;
}

namespace {

bool parse_byte_token(std::string_view t, char* byte) {
  if (t.size() != 6 || t[0] != '<' || t[1] != '0' || t[2] != 'x' || t[5] != '>') return false;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(t[3]), lo = hex(t[4]);
  if (hi < 0 || lo < 0) return false;
  *byte = static_cast<char>(hi * 16 + lo);
  return true;
}

void strip_token(std::string* s, std::string_view content, int32_t start, int32_t stop) {
  size_t b = 0, e = s->size();
  for (int32_t k = 0; k < start && e - b >= content.size() && s->compare(b, content.size(), content) == 0;
       ++k) {
    b += content.size();
  }
  for (int32_t k = 0;
       k < stop && e - b >= content.size() && s->compare(e - content.size(), content.size(), content) == 0;
       ++k) {
    e -= content.size();
  }
  *s = s->substr(b, e - b);
}

}  // namespace

void Decoder::decode_token(std::string_view token, State* st, std::string* out) const {
  if (!present) {
    if (st->index++ > 0) out->push_back(' ');
    out->append(token);
    st->emitted = st->emitted || !token.empty();
    return;
  }
  std::string s(token), tmp;
  for (size_t k = 0; k < steps.size(); ++k) {
    const DecoderStep& d = steps[k];
    switch (d.kind) {
      case DecoderKind::kByteLevel:
        tmp.clear();
        if (byte_level_to_bytes(s, &tmp)) s.swap(tmp);
        break;
      case DecoderKind::kReplace: {
        if (d.pattern.empty()) break;
        tmp.clear();
        size_t prev = 0, pos;
        while ((pos = s.find(d.pattern, prev)) != std::string::npos) {
          tmp.append(s, prev, pos - prev);
          tmp.append(d.content);
          prev = pos + d.pattern.size();
        }
        tmp.append(s, prev, std::string::npos);
        s.swap(tmp);
        break;
      }
      case DecoderKind::kByteFallback: {
        char b;
        if (parse_byte_token(s, &b)) s.assign(1, b);
        break;
      }
      case DecoderKind::kFuse:
        break;
      case DecoderKind::kStrip:
        if (!d.after_fuse) {
          strip_token(&s, d.content, d.start, d.stop);
        } else {
          while (st->left[k] > 0 && !s.empty()) {
            if (s.compare(0, d.content.size(), d.content) != 0) {
              st->left[k] = 0;
              break;
            }
            s.erase(0, d.content.size());
            --st->left[k];
          }
        }
        break;
      case DecoderKind::kMetaspace: {
        const bool first = d.after_fuse || st->index == 0;
        tmp.clear();
        size_t prev = 0, pos;
        while ((pos = s.find(d.replacement, prev)) != std::string::npos) {
          tmp.append(s, prev, pos - prev);
          if (!(first && d.prepend)) tmp.push_back(' ');
          prev = pos + d.replacement.size();
        }
        tmp.append(s, prev, std::string::npos);
        s.swap(tmp);
        break;
      }
    }
  }
  ++st->index;
  st->emitted = st->emitted || !s.empty();
  out->append(s);
}

}  // namespace fathom::tok
