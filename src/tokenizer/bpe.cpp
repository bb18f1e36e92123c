// BPE model: see bpe.h. The merge loop mirrors the Rust `tokenizers` crate (Word::merge_all): a
// min-heap of (rank, position) candidates; an entry is stale when the pair at its position no
// longer merges into the same id. Words that repeat (almost all of them in real text) come from
// the cache instead.
#include "tokenizer/bpe.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

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

FlatWordCache::FlatWordCache() {
  reset();
}

void FlatWordCache::reset() {
  slots_.assign(kSlots, Slot{});
  keys_.clear();
  ids_.clear();
  used_ = 0;
}

bool FlatWordCache::lookup(std::string_view word, uint64_t hash, std::vector<Id>* out) const {
  hash |= 1;
  size_t i = hash & (kSlots - 1);
  while (true) {
    const Slot& s = slots_[i];
    if (s.hash == 0) return false;
    if (s.hash == hash && s.key_len == word.size() &&
        std::memcmp(keys_.data() + s.key_off, word.data(), word.size()) == 0) {
      out->insert(out->end(), ids_.begin() + s.ids_off, ids_.begin() + s.ids_off + s.n_ids);
      return true;
    }
    i = (i + 1) & (kSlots - 1);
  }
}

void FlatWordCache::insert(std::string_view word, uint64_t hash, const Id* ids, size_t n) {
  if (word.size() > UINT16_MAX || n > UINT16_MAX) return;
  if (used_ >= kSlots / 2) reset();
  hash |= 1;
  size_t i = hash & (kSlots - 1);
  while (slots_[i].hash != 0) i = (i + 1) & (kSlots - 1);
  Slot& s = slots_[i];
  s.hash = hash;
  s.key_off = static_cast<uint32_t>(keys_.size());
  s.key_len = static_cast<uint16_t>(word.size());
  s.ids_off = static_cast<uint32_t>(ids_.size());
  s.n_ids = static_cast<uint16_t>(n);
  keys_.append(word);
  ids_.insert(ids_.end(), ids, ids + n);
  ++used_;
}

namespace {

std::atomic<uint64_t> next_model_uid{1};

// Each thread keeps word caches for the few models it used last (a server has one or two).
struct ThreadCaches {
  struct Entry {
    uint64_t uid = 0, last_use = 0;
    std::unique_ptr<FlatWordCache> cache;
  };
  std::array<Entry, 4> entries;
  uint64_t clock = 0;

  FlatWordCache* get(uint64_t uid) {
    ++clock;
    Entry* victim = &entries[0];
    for (Entry& e : entries) {
      if (e.uid == uid) {
        e.last_use = clock;
        return e.cache.get();
      }
      if (e.last_use < victim->last_use) victim = &e;
    }
    if (!victim->cache) {
      victim->cache = std::make_unique<FlatWordCache>();
    } else {
      victim->cache->reset();
    }
    victim->uid = uid;
    victim->last_use = clock;
    return victim->cache.get();
  }
};

}  // namespace

BpeModel::Session::Session(const BpeModel& model) : model_(model) {
  thread_local ThreadCaches caches;
  cache_ = caches.get(model.uid_);
}

BpeModel::Session::~Session() {
  if (hits_) model_.hits_.fetch_add(hits_, std::memory_order_relaxed);
  if (misses_) model_.misses_.fetch_add(misses_, std::memory_order_relaxed);
}

void BpeModel::Session::encode_piece(std::string_view piece, std::vector<Id>* out) {
  if (piece.empty()) return;
  const BpeModel& m = model_;
  if (m.options_.ignore_merges) {
    const StringIdMap& v = m.byte_level_ ? m.raw_vocab_ : m.vocab_;
    if (auto it = v.find(piece); it != v.end()) {
      out->push_back(it->second);
      return;
    }
  }
  constexpr size_t kMaxCachedBytes = 256;
  if (piece.size() > kMaxCachedBytes) {
    m.encode_uncached(piece, out);
    return;
  }
  const uint64_t h = XXH3_64bits(piece.data(), piece.size());
  if (cache_->lookup(piece, h, out)) {
    ++hits_;
    return;
  }
  ++misses_;
  const size_t start = out->size();
  m.encode_uncached(piece, out);
  cache_->insert(piece, h, out->data() + start, out->size() - start);
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
  m->uid_ = next_model_uid.fetch_add(1);
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

namespace {

struct Candidate {
  int32_t rank, pos;
  Id merged;
};
// std heaps are max-heaps: "later" puts the lowest (rank, pos) on top, as Hugging Face orders.
bool later(const Candidate& a, const Candidate& b) {
  return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
}

// Merges the pair at `pos` into `merged` unless the entry is stale (the pair there no longer
// merges into `merged`); then offers the two new pairs to push(pos, left, right).
template <typename Push>
void apply_candidate(const MergeTable& table, std::vector<BpeSymbol>& s, int32_t pos, Id merged,
                     Push&& push) {
  BpeSymbol& cur = s[pos];
  if (cur.len == 0 || cur.next < 0) return;
  const BpeSymbol right = s[cur.next];
  const MergeTable::Entry e = table.find(cur.id, right.id);
  if (e.rank < 0 || e.merged != merged) return;  // stale
  s[cur.next].len = 0;
  cur.id = merged;
  cur.len += right.len;
  cur.next = right.next;
  if (right.next >= 0) s[right.next].prev = pos;
  if (cur.prev >= 0) push(cur.prev, s[cur.prev].id, cur.id);
  if (cur.next >= 0) push(pos, cur.id, s[cur.next].id);
}

void run_heap(const MergeTable& table, std::vector<BpeSymbol>& s, std::vector<Candidate>& heap) {
  std::make_heap(heap.begin(), heap.end(), later);
  auto push = [&](int32_t pos, Id left, Id right) {
    const MergeTable::Entry e = table.find(left, right);
    if (e.rank < 0) return;
    heap.push_back({e.rank, pos, e.merged});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate top = heap.back();
    heap.pop_back();
    apply_candidate(table, s, top.pos, top.merged, push);
  }
}

// Scratch for long words: one bucket of (pos, merged) per rank, a min-heap of the ranks with
// entries, and a min-heap (by pos) of entries created at the rank being processed.
struct LongWordScratch {
  struct Entry {
    int32_t pos;
    Id merged;
  };
  std::vector<std::vector<Entry>> buckets;
  std::vector<int32_t> ranks;  // min-heap
  std::vector<Entry> urgent;   // min-heap by pos
};

}  // namespace

void BpeModel::merge_all(std::vector<Symbol>* syms) const {
  thread_local std::vector<Candidate> heap;
  heap.clear();
  std::vector<Symbol>& s = *syms;
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    const MergeTable::Entry e = merge_table_.find(s[i].id, s[i + 1].id);
    if (e.rank >= 0) heap.push_back({e.rank, static_cast<int32_t>(i), e.merged});
  }
  run_heap(merge_table_, s, heap);
}

// The same merge order as merge_all — lowest rank first, then lowest position — with a bucket
// per rank instead of one heap over every pair, which keeps a 1 MB word in cache-friendly
// arrays. Ranks only grow while merging in a trained vocabulary; if one does not (a new pair
// ranks below the current one), the remaining work moves to the heap of merge_all.
void BpeModel::merge_all_long(std::vector<Symbol>* syms) const {
  using Entry = LongWordScratch::Entry;
  thread_local LongWordScratch st;
  std::vector<Symbol>& s = *syms;
  if (st.buckets.size() < merge_list_.size()) st.buckets.resize(merge_list_.size());
  st.ranks.clear();
  st.urgent.clear();
  auto rank_after = std::greater<int32_t>();
  auto pos_after = [](const Entry& a, const Entry& b) { return a.pos > b.pos; };
  int32_t current = -1;
  bool fallback = false;
  thread_local std::vector<Candidate> heap;
  heap.clear();
  auto push = [&](int32_t pos, Id left, Id right) {
    const MergeTable::Entry e = merge_table_.find(left, right);
    if (e.rank < 0) return;
    if (fallback || e.rank < current) {
      fallback = true;
      heap.push_back({e.rank, pos, e.merged});
    } else if (e.rank == current) {
      st.urgent.push_back({pos, e.merged});
      std::push_heap(st.urgent.begin(), st.urgent.end(), pos_after);
    } else {
      auto& b = st.buckets[e.rank];
      if (b.empty()) {
        st.ranks.push_back(e.rank);
        std::push_heap(st.ranks.begin(), st.ranks.end(), rank_after);
      }
      b.push_back({pos, e.merged});
    }
  };
  for (size_t i = 0; i + 1 < s.size(); ++i) push(static_cast<int32_t>(i), s[i].id, s[i + 1].id);
  while (!st.ranks.empty() && !fallback) {
    std::pop_heap(st.ranks.begin(), st.ranks.end(), rank_after);
    current = st.ranks.back();
    st.ranks.pop_back();
    std::vector<Entry>& b = st.buckets[current];
    std::sort(b.begin(), b.end(), [](const Entry& x, const Entry& y) { return x.pos < y.pos; });
    size_t k = 0;
    while (!fallback) {
      Entry c;
      if (!st.urgent.empty() && (k >= b.size() || st.urgent.front().pos < b[k].pos)) {
        std::pop_heap(st.urgent.begin(), st.urgent.end(), pos_after);
        c = st.urgent.back();
        st.urgent.pop_back();
      } else if (k < b.size()) {
        c = b[k++];
      } else {
        break;
      }
      apply_candidate(merge_table_, s, c.pos, c.merged, push);
    }
    if (fallback) {  // hand everything left to the heap
      for (size_t j = k; j < b.size(); ++j) heap.push_back({current, b[j].pos, b[j].merged});
      for (const Entry& u : st.urgent) heap.push_back({current, u.pos, u.merged});
      for (int32_t r : st.ranks) {
        for (const Entry& x : st.buckets[r]) heap.push_back({r, x.pos, x.merged});
        st.buckets[r].clear();
      }
      st.ranks.clear();
      st.urgent.clear();
    }
    b.clear();
  }
  if (fallback) run_heap(merge_table_, s, heap);
}

void BpeModel::encode_uncached_for_test(std::string_view piece, bool long_path, std::vector<Id>* out) const {
  std::vector<Symbol> syms;
  initial_symbols(piece, &syms);
  if (long_path) {
    merge_all_long(&syms);
  } else {
    merge_all(&syms);
  }
  for (const Symbol& sym : syms) {
    if (sym.len != 0) out->push_back(sym.id);
  }
}

void BpeModel::encode_uncached(std::string_view piece, std::vector<Id>* out) const {
  thread_local std::vector<Symbol> syms;
  initial_symbols(piece, &syms);
  if (syms.size() >= kLongWordSymbols) {
    merge_all_long(&syms);
  } else {
    merge_all(&syms);
  }
  for (const Symbol& sym : syms) {
    if (sym.len != 0) out->push_back(sym.id);
  }
}

}  // namespace fathom::tok
