// KvCache: page allocation (free list, refcounts, LRU of cached pages), sequences and their block
// tables, copy-on-write, publishing full pages under their prefix hash, prefix attach. Page blobs
// for the storage tier live in kvcache_blob.cpp.
#include "kvcache/kvcache.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "base/check.h"
#include "base/progress.h"
#include "kvcache/kvcache_impl.h"

namespace fathom {
namespace {

constexpr int kMaxLayers = 4096;
constexpr int kMaxSequences = 1 << 20;

Status validate_options(const KvCacheOptions& o) {
  TRY(o.format.validate());
  if (o.n_layers < 1 || o.n_layers > kMaxLayers) {
    return invalid_argument("kvcache: n_layers is {}, expected 1..{}", o.n_layers, kMaxLayers);
  }
  if (o.max_sequences < 1 || o.max_sequences > kMaxSequences) {
    return invalid_argument("kvcache: max_sequences is {}, expected 1..{}", o.max_sequences, kMaxSequences);
  }
  if (o.max_tokens_per_sequence < 1 || o.max_tokens_per_sequence > std::numeric_limits<int32_t>::max()) {
    return invalid_argument("kvcache: max_tokens_per_sequence is {}, expected 1..2^31-1",
                            o.max_tokens_per_sequence);
  }
  const uint64_t all_layers =
      static_cast<uint64_t>(o.format.page_bytes()) * static_cast<uint64_t>(o.n_layers);
  if (o.capacity_bytes < all_layers) {
    return invalid_argument(
        "kvcache: capacity {} holds no page: one page of {} tokens is {} ({} layers x {} B, {} per token per "
        "layer)",
        format_bytes(o.capacity_bytes), o.format.page_tokens, format_bytes(all_layers), o.n_layers,
        o.format.page_bytes(), o.format.token_bytes());
  }
  if (o.capacity_bytes / all_layers > static_cast<uint64_t>(std::numeric_limits<int32_t>::max() - 1)) {
    return invalid_argument("kvcache: capacity {} is more than 2^31-1 pages", format_bytes(o.capacity_bytes));
  }
  return {};
}

}  // namespace

KvCache::Impl::~Impl() {
  if (pool) munmap(pool, pool_bytes);
}

void KvCache::Impl::lru_push(int32_t id) {
  const auto i = static_cast<size_t>(id);
  lru_prev[i] = lru_tail;
  lru_next[i] = -1;
  if (lru_tail >= 0) {
    lru_next[static_cast<size_t>(lru_tail)] = id;
  } else {
    lru_head = id;
  }
  lru_tail = id;
  ++lru_count;
}

void KvCache::Impl::lru_remove(int32_t id) {
  const auto i = static_cast<size_t>(id);
  const int32_t prev = lru_prev[i], next = lru_next[i];
  if (prev >= 0) {
    lru_next[static_cast<size_t>(prev)] = next;
  } else {
    lru_head = next;
  }
  if (next >= 0) {
    lru_prev[static_cast<size_t>(next)] = prev;
  } else {
    lru_tail = prev;
  }
  lru_prev[i] = lru_next[i] = -1;
  --lru_count;
}

int32_t KvCache::Impl::alloc_page() {
  int32_t id = -1;
  if (!free_list.empty()) {
    id = free_list.back();
    free_list.pop_back();
  } else if (lru_head >= 0) {
    id = lru_head;
    lru_remove(id);
    index.erase(id);
    published[static_cast<size_t>(id)] = 0;
    ++counters.evictions;
  } else {
    return -1;
  }
  hashed[static_cast<size_t>(id)] = 0;
  ref[static_cast<size_t>(id)] = 1;
  return id;
}

void KvCache::Impl::acquire(int32_t id) {
  if (ref[static_cast<size_t>(id)]++ == 0) lru_remove(id);  // a cached page comes back into use
}

void KvCache::Impl::release(int32_t id) {
  const auto i = static_cast<size_t>(id);
  CHECK(ref[i] > 0);
  if (--ref[i] > 0) return;
  if (published[i]) {
    lru_push(id);
  } else {
    hashed[i] = 0;
    free_list.push_back(id);
  }
}

Result<KvSequence*> KvCache::Impl::sequence(SeqId seq, const char* what) {
  if (seq < 0 || seq >= static_cast<SeqId>(seqs.size()) || !seqs[static_cast<size_t>(seq)].active) {
    return not_found("kvcache {}: no sequence {}", what, seq);
  }
  return &seqs[static_cast<size_t>(seq)];
}

Result<const KvSequence*> KvCache::Impl::sequence(SeqId seq, const char* what) const {
  if (seq < 0 || seq >= static_cast<SeqId>(seqs.size()) || !seqs[static_cast<size_t>(seq)].active) {
    return not_found("kvcache {}: no sequence {}", what, seq);
  }
  return &seqs[static_cast<size_t>(seq)];
}

KvCache::KvCache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KvCache::~KvCache() = default;

Result<std::unique_ptr<KvCache>> KvCache::create(const KvCacheOptions& o) {
  TRY(validate_options(o));
  const int64_t page_bytes = o.format.page_bytes();
  const auto n_pages =
      static_cast<int64_t>(o.capacity_bytes / (static_cast<uint64_t>(page_bytes) * o.n_layers));
  auto m = std::make_unique<Impl>(n_pages);
  m->o = o;
  m->page_bytes = page_bytes;
  m->n_pages = n_pages;
  m->max_pages = (o.max_tokens_per_sequence + o.format.page_tokens - 1) / o.format.page_tokens;
  m->seed = kv_hash_seed(o.model_fingerprint, o.format);
  m->pool_bytes = static_cast<size_t>(n_pages * page_bytes * o.n_layers);
  void* p = mmap(nullptr, m->pool_bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | (o.populate ? MAP_POPULATE : 0), -1, 0);
  if (p == MAP_FAILED) {
    return resource_exhausted("kvcache: cannot map {} for {} pages: {}", format_bytes(m->pool_bytes), n_pages,
                              std::strerror(errno));
  }
  m->pool = static_cast<uint8_t*>(p);
  madvise(p, m->pool_bytes, MADV_HUGEPAGE);  // advice only: fewer TLB misses for the kernel's page reads
  const auto np = static_cast<size_t>(n_pages);
  m->ref.assign(np, 0);
  m->hashed.assign(np, 0);
  m->published.assign(np, 0);
  m->hash.assign(np, PageHash{});
  m->tokens.assign(np * static_cast<size_t>(o.format.page_tokens), 0);
  m->lru_prev.assign(np, -1);
  m->lru_next.assign(np, -1);
  m->free_list.reserve(np);
  for (int64_t i = n_pages - 1; i >= 0; --i) m->free_list.push_back(static_cast<int32_t>(i));
  m->seqs.resize(static_cast<size_t>(o.max_sequences));
  for (auto& s : m->seqs) {
    s.pages.reserve(static_cast<size_t>(m->max_pages));
    s.written.assign(static_cast<size_t>(o.n_layers), 0);
  }
  m->free_seqs.reserve(static_cast<size_t>(o.max_sequences));
  for (int i = o.max_sequences - 1; i >= 0; --i) m->free_seqs.push_back(i);
  return std::unique_ptr<KvCache>(new KvCache(std::move(m)));
}

const KvCacheOptions& KvCache::options() const {
  return impl_->o;
}
int64_t KvCache::n_pages() const {
  return impl_->n_pages;
}
int64_t KvCache::max_pages_per_sequence() const {
  return impl_->max_pages;
}
int64_t KvCache::page_bytes_all_layers() const {
  return impl_->page_bytes * impl_->o.n_layers;
}
int64_t KvCache::available_pages() const {
  return static_cast<int64_t>(impl_->free_list.size()) + impl_->lru_count;
}
const PageHash& KvCache::hash_seed() const {
  return impl_->seed;
}

KvCacheStats KvCache::stats() const {
  const Impl& m = *impl_;
  KvCacheStats s = m.counters;
  s.pages_total = m.n_pages;
  s.pages_free = static_cast<int64_t>(m.free_list.size());
  s.pages_cached = m.lru_count;
  s.pages_used = m.n_pages - s.pages_free - s.pages_cached;
  s.pages_published = m.index.size();
  s.sequences = static_cast<int>(m.seqs.size() - m.free_seqs.size());
  return s;
}

Result<SeqId> KvCache::add_sequence() {
  Impl& m = *impl_;
  if (m.free_seqs.empty()) {
    return resource_exhausted("kvcache: all {} sequence slots are in use (max_sequences)", m.o.max_sequences);
  }
  const SeqId id = m.free_seqs.back();
  m.free_seqs.pop_back();
  KvSequence& s = m.seqs[static_cast<size_t>(id)];
  s.active = true;
  s.len = 0;
  s.n_hashed = 0;
  s.pages.clear();
  std::fill(s.written.begin(), s.written.end(), 0);
  return id;
}

Result<SeqId> KvCache::fork(SeqId parent) {
  Impl& m = *impl_;
  TRY(m.sequence(parent, "fork"));
  const SeqId child = TRY(add_sequence());
  const KvSequence& p = m.seqs[static_cast<size_t>(parent)];
  KvSequence& c = m.seqs[static_cast<size_t>(child)];
  for (int32_t id : p.pages) {
    m.acquire(id);
    c.pages.push_back(id);
  }
  c.len = p.len;
  c.n_hashed = p.n_hashed;
  c.written = p.written;  // same size: no allocation
  return child;
}

Status KvCache::free_sequence(SeqId seq) {
  Impl& m = *impl_;
  KvSequence* s = TRY(m.sequence(seq, "free_sequence"));
  for (int32_t id : s->pages) m.release(id);
  s->pages.clear();
  s->active = false;
  s->len = 0;
  m.free_seqs.push_back(seq);
  return {};
}

Status KvCache::truncate(SeqId seq, int64_t n_tokens) {
  Impl& m = *impl_;
  KvSequence* s = TRY(m.sequence(seq, "truncate"));
  if (n_tokens < 0 || n_tokens > s->len) {
    return out_of_range("kvcache truncate: sequence {} has {} tokens, cannot keep {}", seq, s->len, n_tokens);
  }
  const int64_t T = m.o.format.page_tokens;
  const auto keep = static_cast<size_t>((n_tokens + T - 1) / T);
  for (size_t i = keep; i < s->pages.size(); ++i) m.release(s->pages[i]);
  s->pages.resize(keep);
  s->len = n_tokens;
  s->n_hashed = std::min(s->n_hashed, n_tokens / T);
  for (int64_t& w : s->written) w = std::min(w, n_tokens);
  // A private, unpublished last page that is partial again will be overwritten: forget its hash.
  if (n_tokens % T != 0 && m.writable(s->pages.back())) m.hashed[static_cast<size_t>(s->pages.back())] = 0;
  return {};
}

Result<int64_t> KvCache::seq_len(SeqId seq) const {
  const KvSequence* s = TRY(impl_->sequence(seq, "seq_len"));
  return s->len;
}

Result<std::span<const int32_t>> KvCache::block_table(SeqId seq) const {
  const KvSequence* s = TRY(impl_->sequence(seq, "block_table"));
  return std::span<const int32_t>(s->pages);
}

Result<int64_t> KvCache::pages_needed(SeqId seq, int64_t n_tokens) const {
  const Impl& m = *impl_;
  const KvSequence* s = TRY(m.sequence(seq, "pages_needed"));
  if (n_tokens <= 0) return int64_t{0};
  const int64_t T = m.o.format.page_tokens;
  const int64_t grow = (s->len + n_tokens + T - 1) / T - static_cast<int64_t>(s->pages.size());
  const bool cow = s->len % T != 0 && !m.writable(s->pages.back());
  return grow + (cow ? 1 : 0);
}

int64_t KvCache::lookup(std::span<const PageHash> chain) const {
  int64_t n = 0;
  while (n < static_cast<int64_t>(chain.size()) && impl_->index.find(chain[static_cast<size_t>(n)]) >= 0) ++n;
  return n;
}

Result<int64_t> KvCache::attach_prefix(SeqId seq, std::span<const int32_t> tokens) {
  Impl& m = *impl_;
  KvSequence* s = TRY(m.sequence(seq, "attach_prefix"));
  if (s->len != 0) {
    return failed_precondition("kvcache attach_prefix: sequence {} already holds {} tokens", seq, s->len);
  }
  const auto T = static_cast<size_t>(m.o.format.page_tokens);
  PageHash parent = m.seed;
  for (size_t begin = 0; begin + T <= tokens.size() && static_cast<int64_t>(s->pages.size()) < m.max_pages;
       begin += T) {
    const std::span<const int32_t> page_tokens = tokens.subspan(begin, T);
    const PageHash h = kv_page_hash(parent, page_tokens);
    const int32_t id = m.index.find(h);
    if (id < 0 || !std::equal(page_tokens.begin(), page_tokens.end(), m.page_tokens(id))) break;
    m.acquire(id);
    s->pages.push_back(id);
    parent = h;
  }
  const auto n_pages = static_cast<int64_t>(s->pages.size());
  s->len = n_pages * static_cast<int64_t>(T);
  s->n_hashed = n_pages;
  std::fill(s->written.begin(), s->written.end(), s->len);
  m.counters.prefix_hit_pages += n_pages;
  return s->len;
}

Status KvCache::append(SeqId seq, std::span<const int32_t> tokens) {
  Impl& m = *impl_;
  KvSequence* s = TRY(m.sequence(seq, "append"));
  const auto n = static_cast<int64_t>(tokens.size());
  if (n == 0) return {};
  if (s->len + n > m.o.max_tokens_per_sequence) {
    return out_of_range("kvcache append: sequence {} would hold {} tokens, max_tokens_per_sequence is {}",
                        seq, s->len + n, m.o.max_tokens_per_sequence);
  }
  const int64_t need = TRY(pages_needed(seq, n));
  if (need > available_pages()) {
    return resource_exhausted(
        "kvcache append: sequence {} needs {} more pages for {} tokens, {} available of {}", seq, need, n,
        available_pages(), m.n_pages);
  }
  const int64_t T = m.o.format.page_tokens;
  if (s->len % T != 0 && !m.writable(s->pages.back())) {  // copy-on-write of the shared partial page
    const int32_t old = s->pages.back(), fresh = m.alloc_page();
    CHECK(fresh >= 0);
    const int64_t used = s->len % T;
    for (int l = 0; l < m.o.n_layers; ++l) {
      std::memcpy(m.page_ptr(l, fresh), m.page_ptr(l, old),
                  static_cast<size_t>(used * m.o.format.token_bytes()));
    }
    std::memcpy(m.page_tokens(fresh), m.page_tokens(old), static_cast<size_t>(used) * 4);
    m.release(old);
    s->pages.back() = fresh;
    ++m.counters.cow_copies;
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = s->len + i;
    if (pos % T == 0) {
      const int32_t id = m.alloc_page();
      CHECK(id >= 0);
      s->pages.push_back(id);
    }
    m.page_tokens(s->pages[static_cast<size_t>(pos / T)])[pos % T] = tokens[static_cast<size_t>(i)];
  }
  s->len += n;
  return {};
}

// Publishes the sequence's pages that are full and written in every layer, in chain order.
void KvCache::Impl::publish_complete(KvSequence& s) {
  Impl& m = *this;
  const int64_t T = m.o.format.page_tokens;
  const int64_t complete = *std::min_element(s.written.begin(), s.written.end());
  for (; s.n_hashed < complete / T; ++s.n_hashed) {
    const int32_t id = s.pages[static_cast<size_t>(s.n_hashed)];
    const auto i = static_cast<size_t>(id);
    if (m.hashed[i]) continue;
    const PageHash& parent = s.n_hashed == 0 ? m.seed : m.hash[static_cast<size_t>(s.pages[s.n_hashed - 1])];
    m.hash[i] = kv_page_hash(parent, std::span<const int32_t>(m.page_tokens(id), static_cast<size_t>(T)));
    m.hashed[i] = 1;
    if (m.index.find(m.hash[i]) < 0) {  // else an identical page is already published: stay private
      m.index.insert(id);
      m.published[i] = 1;
    }
  }
}

Status KvCache::write(SeqId seq, int layer, int64_t pos, std::span<const float> values) {
  Impl& m = *impl_;
  KvSequence* s = TRY(m.sequence(seq, "write"));
  const MlaKvFormat& f = m.o.format;
  if (layer < 0 || layer >= m.o.n_layers) {
    return out_of_range("kvcache write: layer {} is outside 0..{}", layer, m.o.n_layers - 1);
  }
  if (values.size() % static_cast<size_t>(f.d_qk()) != 0) {
    return invalid_argument(
        "kvcache write: {} values is not a whole number of tokens of {} (d_latent {} + d_rope {})",
        values.size(), f.d_qk(), f.d_latent, f.d_rope);
  }
  const auto n = static_cast<int64_t>(values.size() / static_cast<size_t>(f.d_qk()));
  const int64_t written = s->written[static_cast<size_t>(layer)];
  if (pos < 0 || pos > written || pos + n > s->len) {
    return out_of_range(
        "kvcache write: positions [{}, {}) of layer {}: sequence {} has {} tokens appended, {} written in "
        "this layer "
        "(write in order, after append)",
        pos, pos + n, layer, seq, s->len, written);
  }
  const int64_t T = f.page_tokens;
  for (int64_t pg = pos / T; n > 0 && pg <= (pos + n - 1) / T; ++pg) {
    const int32_t id = s->pages[static_cast<size_t>(pg)];
    if (!m.writable(id)) {
      return failed_precondition("kvcache write: page {} of sequence {} is shared or published (immutable)",
                                 pg, seq);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = pos + i;
    uint8_t* slot = m.page_ptr(layer, s->pages[static_cast<size_t>(p / T)]) + (p % T) * f.token_bytes();
    mla_kv_encode_token(f, values.data() + i * f.d_qk(), slot);
  }
  s->written[static_cast<size_t>(layer)] = std::max(written, pos + n);
  m.publish_complete(*s);
  return {};
}

Status KvCache::read(SeqId seq, int layer, int64_t pos, int64_t n, std::span<float> out) const {
  const Impl& m = *impl_;
  const KvSequence* s = TRY(m.sequence(seq, "read"));
  const MlaKvFormat& f = m.o.format;
  if (layer < 0 || layer >= m.o.n_layers) {
    return out_of_range("kvcache read: layer {} is outside 0..{}", layer, m.o.n_layers - 1);
  }
  if (pos < 0 || n < 0 || pos + n > s->len) {
    return out_of_range("kvcache read: positions [{}, {}) but sequence {} has {} tokens", pos, pos + n, seq,
                        s->len);
  }
  if (out.size() < static_cast<size_t>(n * f.d_qk())) {
    return invalid_argument("kvcache read: output holds {} floats, {} tokens need {}", out.size(), n,
                            n * f.d_qk());
  }
  const int64_t T = f.page_tokens;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = pos + i;
    const uint8_t* slot = m.page_ptr(layer, s->pages[static_cast<size_t>(p / T)]) + (p % T) * f.token_bytes();
    mla_kv_decode_token(f, slot, out.data() + i * f.d_qk());
  }
  return {};
}

MlaCacheView KvCache::layer_view(int layer) const {
  const Impl& m = *impl_;
  CHECK_MSG(layer >= 0 && layer < m.o.n_layers, "layer {} of {}", layer, m.o.n_layers);
  return {m.page_ptr(layer, 0), m.n_pages, m.page_bytes, m.o.format};
}

Status KvCache::fill_batch(std::span<const SeqId> seqs, int64_t max_pages, int32_t* block_tables,
                           int32_t* seqlens) const {
  const Impl& m = *impl_;
  for (size_t b = 0; b < seqs.size(); ++b) {
    const KvSequence* s = TRY(m.sequence(seqs[b], "fill_batch"));
    if (static_cast<int64_t>(s->pages.size()) > max_pages) {
      return out_of_range("kvcache fill_batch: sequence {} has {} pages, the table holds {}", seqs[b],
                          s->pages.size(), max_pages);
    }
    int32_t* row = block_tables + static_cast<int64_t>(b) * max_pages;
    std::copy(s->pages.begin(), s->pages.end(), row);
    std::fill(row + s->pages.size(), row + max_pages, -1);
    seqlens[b] = static_cast<int32_t>(s->len);
  }
  return {};
}

}  // namespace fathom
