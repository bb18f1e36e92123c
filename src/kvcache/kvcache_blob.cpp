// Page blobs for the storage tier: export a published page with every layer's bytes, import one
// back as a cached page after checking its format, checksum and prefix hash. Layout (version 1,
// little-endian, docs/kvcache.md):
//
//   [0, 4)    magic "FKVP"          [4, 8)   blob version 1      [8, 12)  layout version
//   [12, 16)  KV dtype (0 bf16, 1 fp8)  [16, 20) page_tokens  [20, 24) d_latent  [24, 28) d_rope
//   [28, 32)  n_layers              [32, 64) page hash          [64, 72) XXH3-64 of the payload
//   [72, 128) zero
//   payload:  page_tokens int32 token ids, then n_layers x page_bytes (layer 0 first)
#include <xxhash.h>

#include <cstring>

#include "kvcache/kvcache_impl.h"

namespace fathom {
namespace {

constexpr int64_t kHeaderBytes = 128;
constexpr uint32_t kBlobVersion = 1;
constexpr char kMagic[4] = {'F', 'K', 'V', 'P'};

void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

// The header fields that must match this cache, in order, with their names for errors.
struct HeaderField {
  const char* name;
  uint32_t offset;
  uint32_t expected;
};

}  // namespace

int64_t KvCache::export_blob_bytes() const {
  const Impl& m = *impl_;
  return kHeaderBytes + int64_t{4} * m.o.format.page_tokens + m.page_bytes * m.o.n_layers;
}

Status KvCache::export_page(const PageHash& hash, std::span<uint8_t> out) const {
  const Impl& m = *impl_;
  const int32_t id = m.index.find(hash);
  if (id < 0) return not_found("kvcache export: page {} is not published here", page_hash_hex(hash));
  if (static_cast<int64_t>(out.size()) < export_blob_bytes()) {
    return invalid_argument("kvcache export: buffer of {} B, a page blob needs {} B", out.size(),
                            export_blob_bytes());
  }
  const MlaKvFormat& f = m.o.format;
  uint8_t* h = out.data();
  std::memset(h, 0, kHeaderBytes);
  std::memcpy(h, kMagic, 4);
  put_u32(h + 4, kBlobVersion);
  put_u32(h + 8, kMlaKvLayoutVersion);
  put_u32(h + 12, static_cast<uint32_t>(f.dtype));
  put_u32(h + 16, static_cast<uint32_t>(f.page_tokens));
  put_u32(h + 20, static_cast<uint32_t>(f.d_latent));
  put_u32(h + 24, static_cast<uint32_t>(f.d_rope));
  put_u32(h + 28, static_cast<uint32_t>(m.o.n_layers));
  std::memcpy(h + 32, hash.data(), 32);
  uint8_t* payload = h + kHeaderBytes;
  for (int t = 0; t < f.page_tokens; ++t)
    put_u32(payload + 4 * t, static_cast<uint32_t>(m.page_tokens(id)[t]));
  uint8_t* layers = payload + 4 * f.page_tokens;
  for (int l = 0; l < m.o.n_layers; ++l) {
    std::memcpy(layers + l * m.page_bytes, m.page_ptr(l, id), static_cast<size_t>(m.page_bytes));
  }
  put_u64(h + 64, XXH3_64bits(payload, static_cast<size_t>(export_blob_bytes() - kHeaderBytes)));
  return {};
}

Result<PageHash> KvCache::import_page(const PageHash& parent, std::span<const uint8_t> blob) {
  Impl& m = *impl_;
  const MlaKvFormat& f = m.o.format;
  if (static_cast<int64_t>(blob.size()) != export_blob_bytes()) {
    return invalid_argument("kvcache import: blob is {} B, a page of this cache is {} B", blob.size(),
                            export_blob_bytes());
  }
  const uint8_t* h = blob.data();
  if (std::memcmp(h, kMagic, 4) != 0) return corrupt("kvcache import: blob does not start with \"FKVP\"");
  const HeaderField fields[] = {
      {"blob version", 4, kBlobVersion},
      {"layout version", 8, kMlaKvLayoutVersion},
      {"kv dtype", 12, static_cast<uint32_t>(f.dtype)},
      {"page_tokens", 16, static_cast<uint32_t>(f.page_tokens)},
      {"d_latent", 20, static_cast<uint32_t>(f.d_latent)},
      {"d_rope", 24, static_cast<uint32_t>(f.d_rope)},
      {"n_layers", 28, static_cast<uint32_t>(m.o.n_layers)},
  };
  for (const HeaderField& field : fields) {
    const uint32_t got = get_u32(h + field.offset);
    if (got != field.expected) {
      return invalid_argument("kvcache import: blob has {} {}, this cache expects {}", field.name, got,
                              field.expected);
    }
  }
  for (int64_t i = 72; i < kHeaderBytes; ++i) {
    if (h[i] != 0) return corrupt("kvcache import: reserved header byte {} is {:#04x}, expected 0", i, h[i]);
  }
  const uint8_t* payload = h + kHeaderBytes;
  const uint64_t sum = XXH3_64bits(payload, blob.size() - kHeaderBytes);
  if (sum != get_u64(h + 64)) {
    return corrupt("kvcache import: payload checksum {:016x} does not match the header's {:016x}", sum,
                   get_u64(h + 64));
  }
  PageHash claimed;
  std::memcpy(claimed.data(), h + 32, 32);
  int32_t tokens[256];
  for (int t = 0; t < f.page_tokens; ++t) tokens[t] = static_cast<int32_t>(get_u32(payload + 4 * t));
  const PageHash actual =
      kv_page_hash(parent, std::span<const int32_t>(tokens, static_cast<size_t>(f.page_tokens)));
  if (actual != claimed) {
    return corrupt("kvcache import: blob is page {}, but its parent and tokens hash to {}",
                   page_hash_hex(claimed), page_hash_hex(actual));
  }
  if (const int32_t present = m.index.find(actual); present >= 0) {
    if (m.ref[static_cast<size_t>(present)] == 0) {  // cached: now the most recently used
      m.lru_remove(present);
      m.lru_push(present);
    }
    return actual;
  }
  const int32_t id = m.alloc_page();
  if (id < 0) return resource_exhausted("kvcache import: no free or cached page among {}", m.n_pages);
  std::memcpy(m.page_tokens(id), tokens, static_cast<size_t>(f.page_tokens) * 4);
  const uint8_t* layers = payload + 4 * f.page_tokens;
  for (int l = 0; l < m.o.n_layers; ++l) {
    std::memcpy(m.page_ptr(l, id), layers + l * m.page_bytes, static_cast<size_t>(m.page_bytes));
  }
  const auto i = static_cast<size_t>(id);
  m.hash[i] = actual;
  m.hashed[i] = 1;
  m.published[i] = 1;
  m.index.insert(id);
  m.release(id);  // ref 0, published: cached, most recently used
  return actual;
}

}  // namespace fathom
