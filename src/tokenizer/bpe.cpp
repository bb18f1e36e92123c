// BPE model: see bpe.h. The merge loop mirrors the Rust `tokenizers` crate (Word::merge_all): a
// min-heap of (rank, position) candidates; an entry is stale when the pair at its position no
// longer merges into the same id. Words that repeat (almost all of them in real text) come from
// the cache instead.
#include "tokenizer/bpe.h"

#include <xxhash.h>

#include <algorithm>

#include "tokenizer/unicode.h"

namespace fathom::tok {

size_t StringHash::operator()(std::string_view s) const {
  return static_cast<size_t>(XXH3_64bits(s.data(), s.size()));
}

void MergeTable::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  keys_.assign(cap, kEmpty);
  values_.assign(cap, Entry{-1, -1});
  mask_ = cap - 1;
  size_ = 0;
}

bool MergeTable::insert(Id left, Id right, int32_t rank, Id merged) {
  if ((size_ + 1) * 2 > keys_.size()) {  // grow (rare: reserve() is called with the final size)
    std::vector<uint64_t> old_keys = std::move(keys_);
    std::vector<Entry> old_values = std::move(values_);
    reserve(std::max<size_t>(16, old_keys.size()));
    for (size_t i = 0; i < old_keys.size(); ++i) {
      if (old_keys[i] != kEmpty)
        insert(Id(old_keys[i] >> 32), Id(uint32_t(old_keys[i])), old_values[i].rank, old_values[i].merged);
    }
  }
  const uint64_t key = make_key(left, right);
  size_t i = hash(key) & mask_;
  while (keys_[i] != kEmpty) {
    if (keys_[i] == key) return false;
    i = (i + 1) & mask_;
  }
  keys_[i] = key;
  values_[i] = {rank, merged};
  ++size_;
  return true;
}

WordCache::WordCache(size_t capacity) : capacity_per_shard_(std::max<size_t>(1, capacity / kShards)) {}

bool WordCache::lookup(std::string_view word, std::vector<Id>* out) const {
  const size_t h = StringHash{}(word);
  Shard& s = shards_[h >> 60];
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.map.find(word);
  if (it == s.map.end()) {
    ++s.misses;
    return false;
  }
  ++s.hits;
  out->insert(out->end(), it->second.begin(), it->second.end());
  return true;
}

void WordCache::insert(std::string_view word, const Id* ids, size_t n) const {
  const size_t h = StringHash{}(word);
  Shard& s = shards_[h >> 60];
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.map.size() >= capacity_per_shard_) return;  // full: stop caching (as Hugging Face does)
  s.map.try_emplace(std::string(word), ids, ids + n);
}

int64_t WordCache::hits() const {
  int64_t n = 0;
  for (auto& s : shards_) {
    std::lock_guard<std::mutex> lock(s.mu);
    n += s.hits;
  }
  return n;
}

int64_t WordCache::misses() const {
  int64_t n = 0;
  for (auto& s : shards_) {
    std::lock_guard<std::mutex> lock(s.mu);
    n += s.misses;
  }
  return n;
}

Result<std::unique_ptr<BpeModel>> BpeModel::create(
    StringIdMap vocab, const std::vector<std::pair<std::string, std::string>>& merges,
    const BpeOptions& options, bool byte_level) {
  auto m = std::unique_ptr<BpeModel>(new BpeModel());
  m->options_ = options;
  m->byte_level_ = byte_level;
  Id max_id = -1;
  for (const auto& [tok, id] : vocab) {
    if (id < 0) return invalid_argument("model.vocab: token '{}' has negative id {}", tok, id);
    max_id = std::max(max_id, id);
  }
  if (max_id >= (Id{1} << 30)) return invalid_argument("model.vocab: id {} is too large", max_id);
  m->id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  m->has_token_.assign(static_cast<size_t>(max_id + 1), 0);
  for (const auto& [tok, id] : vocab) {
    if (m->has_token_[id]) {
      return invalid_argument("model.vocab: id {} is used by both '{}' and '{}'", id, m->id_to_token_[id],
                              tok);
    }
    m->id_to_token_[id] = tok;
    m->has_token_[id] = 1;
  }
  m->merge_table_.reserve(merges.size());
  m->merge_list_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    auto ia = vocab.find(a), ib = vocab.find(b);
    if (ia == vocab.end() || ib == vocab.end()) {
      return invalid_argument("model.merges[{}] '{} {}': token '{}' is not in the vocabulary", r, a, b,
                              ia == vocab.end() ? a : b);
    }
    std::string joined = a;
    const std::string_view b_view = b;
    // continuing_subword_prefix is dropped from the right part when joining (as Hugging Face).
    if (!options.continuing_subword_prefix.empty() && b_view.starts_with(options.continuing_subword_prefix)) {
      joined.append(b_view.substr(options.continuing_subword_prefix.size()));
    } else {
      joined.append(b_view);
    }
    auto ij = vocab.find(joined);
    if (ij == vocab.end()) {
      return invalid_argument("model.merges[{}] '{} {}': the merged token '{}' is not in the vocabulary", r,
                              a, b, joined);
    }
    m->merge_table_.insert(ia->second, ib->second, static_cast<int32_t>(r), ij->second);
    m->merge_list_.emplace_back(ia->second, ib->second);
  }
  m->byte_ids_.fill(-1);
  m->fallback_ids_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    std::string s;
    utf8_append(&s, byte_to_unicode()[b]);
    if (auto it = vocab.find(s); it != vocab.end()) m->byte_ids_[b] = it->second;
    if (auto it = vocab.find(fmt::format("<0x{:02X}>", b)); it != vocab.end())
      m->fallback_ids_[b] = it->second;
  }
  if (!options.unk_token.empty()) {
    auto it = vocab.find(options.unk_token);
    if (it == vocab.end())
      return invalid_argument("model.unk_token '{}' is not in the vocabulary", options.unk_token);
    m->unk_id_ = it->second;
  }
  if (byte_level && options.ignore_merges) {
    for (const auto& [tok, id] : vocab) {
      std::string raw;
      if (byte_level_to_bytes(tok, &raw)) m->raw_vocab_.emplace(std::move(raw), id);
    }
  }
  m->vocab_ = std::move(vocab);
  return m;
}

bool BpeModel::id_to_token(Id id, std::string_view* token) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_token_[id]) return false;
  *token = id_to_token_[id];
  return true;
}

void BpeModel::initial_symbols(std::string_view piece, std::vector<Symbol>* syms) const {
  syms->clear();
  auto add = [&](Id id, uint32_t len) {
    const int32_t k = static_cast<int32_t>(syms->size());
    syms->push_back({id, k - 1, k + 1, len});
  };
  if (byte_level_) {
    for (unsigned char b : piece) {
      if (byte_ids_[b] >= 0) {
        add(byte_ids_[b], 1);
      } else if (unk_id_ >= 0) {
        if (options_.fuse_unk && !syms->empty() && syms->back().id == unk_id_) {
          syms->back().len += 1;
        } else {
          add(unk_id_, 1);
        }
      }
    }
  } else {
    // Hugging Face's merge_word: per character, with the subword prefix/suffix, byte fallback and
    // (fused) unknown tokens; a pending unknown is flushed before the next known character.
    Id unk = -1;
    uint32_t unk_len = 0;
    std::string s;
    size_t i = 0;
    while (i < piece.size()) {
      const size_t len = static_cast<size_t>(utf8_len(static_cast<unsigned char>(piece[i])));
      const bool first = i == 0, last = i + len >= piece.size();
      s.clear();
      if (!first) s += options_.continuing_subword_prefix;
      s.append(piece.substr(i, len));
      if (last) s += options_.end_of_word_suffix;
      i += len;
      if (auto it = vocab_.find(s); it != vocab_.end()) {
        if (unk >= 0) add(unk, unk_len), unk = -1;
        add(it->second, static_cast<uint32_t>(len));
        continue;
      }
      if (options_.byte_fallback) {
        bool all = true;
        for (unsigned char b : s) all = all && fallback_ids_[b] >= 0;
        if (all) {
          for (unsigned char b : s) add(fallback_ids_[b], 1);
          continue;
        }
      }
      if (unk_id_ >= 0) {
        if (unk >= 0 && options_.fuse_unk) {
          unk_len += static_cast<uint32_t>(len);
        } else {
          if (unk >= 0) add(unk, unk_len);
          unk = unk_id_;
          unk_len = static_cast<uint32_t>(len);
        }
      }
    }
    if (unk >= 0) add(unk, unk_len);
  }
  if (!syms->empty()) syms->back().next = -1;
}

void BpeModel::merge_all(std::vector<Symbol>* syms) const {
  struct Candidate {
    int32_t rank, pos;
    Id merged;
  };
  // std heaps are max-heaps: "greater" puts the lowest (rank, pos) on top.
  auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  thread_local std::vector<Candidate> heap;
  heap.clear();
  std::vector<Symbol>& s = *syms;
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    const MergeTable::Entry e = merge_table_.find(s[i].id, s[i + 1].id);
    if (e.rank >= 0) heap.push_back({e.rank, static_cast<int32_t>(i), e.merged});
  }
  std::make_heap(heap.begin(), heap.end(), later);
  auto push = [&](int32_t pos, Id left, Id right) {
    const MergeTable::Entry e = merge_table_.find(left, right);
    if (e.rank < 0) return;
    heap.push_back({e.rank, pos, e.merged});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& cur = s[top.pos];
    if (cur.len == 0 || cur.next < 0) continue;
    const Symbol right = s[cur.next];
    const MergeTable::Entry e = merge_table_.find(cur.id, right.id);
    if (e.rank < 0 || e.merged != top.merged) continue;  // stale
    s[cur.next].len = 0;
    cur.id = top.merged;
    cur.len += right.len;
    cur.next = right.next;
    if (right.next >= 0) s[right.next].prev = top.pos;
    if (cur.prev >= 0) push(cur.prev, s[cur.prev].id, cur.id);
    if (cur.next >= 0) push(top.pos, cur.id, s[cur.next].id);
  }
}

void BpeModel::encode_piece(std::string_view piece, std::vector<Id>* out) const {
  if (piece.empty()) return;
  if (options_.ignore_merges) {
    const StringIdMap& m = byte_level_ ? raw_vocab_ : vocab_;
    if (auto it = m.find(piece); it != m.end()) {
      out->push_back(it->second);
      return;
    }
  }
  constexpr size_t kMaxCachedBytes = 128;
  const bool cacheable = piece.size() <= kMaxCachedBytes;
  if (cacheable && cache_.lookup(piece, out)) return;
  thread_local std::vector<Symbol> syms;
  initial_symbols(piece, &syms);
  merge_all(&syms);
  const size_t start = out->size();
  for (const Symbol& sym : syms) {
    if (sym.len != 0) out->push_back(sym.id);
  }
  if (cacheable) cache_.insert(piece, out->data() + start, out->size() - start);
}

}  // namespace fathom::tok
