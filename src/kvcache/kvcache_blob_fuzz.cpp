// libFuzzer target: arbitrary bytes as a page blob for KvCache::import_page (the storage tier's
// input). Byte 0 picks the parent (the seed or bytes 1..32); the rest is the blob, used as is or
// fitted to the expected size so header, checksum and hash checks are reached. An accepted page
// must export back to the same bytes (or, if that hash was cached already, to the cached page of
// that hash) and be found by lookup.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kvcache/kvcache.h"

namespace {

fathom::KvCache& cache() {
  static std::unique_ptr<fathom::KvCache> c = [] {
    const fathom::MlaKvFormat f{.d_latent = 16, .d_rope = 2, .dtype = fathom::MlaKvDType::kFP8, .page_tokens = 2};
    auto r = fathom::KvCache::create({.n_layers = 2, .format = f,
                                      .model_fingerprint = fathom::kv_model_fingerprint("fuzz", ""),
                                      .capacity_bytes = static_cast<uint64_t>(4 * 2 * f.page_bytes()),
                                      .max_sequences = 2, .max_tokens_per_sequence = 8});
    if (!r.ok()) std::abort();
    return std::move(r).value();
  }();
  return *c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  fathom::KvCache& c = cache();
  const uint8_t mode = data[0];
  ++data;
  --size;
  fathom::PageHash parent = c.hash_seed();
  if ((mode & 1) && size >= 32) {
    std::memcpy(parent.data(), data, 32);
    data += 32;
    size -= 32;
  }
  std::vector<uint8_t> blob(data, data + size);
  if (mode & 2) blob.resize(static_cast<size_t>(c.export_blob_bytes()), 0);
  // A page already cached under the blob's hash (an earlier input with the same parent and
  // tokens) is kept as it is: importing it only marks it used, so it exports its own bytes.
  fathom::PageHash claimed{};
  if (blob.size() >= 64) std::memcpy(claimed.data(), blob.data() + 32, 32);
  const bool present = blob.size() >= 64 && c.lookup(std::span<const fathom::PageHash>(&claimed, 1)) == 1;
  auto r = c.import_page(parent, blob);
  if (!r.ok()) return 0;
  std::vector<uint8_t> back(static_cast<size_t>(c.export_blob_bytes()));
  if (!c.export_page(*r, back).ok()) std::abort();
  if (!present && back != blob) std::abort();
  if (present && std::memcmp(back.data() + 32, blob.data() + 32, 32) != 0) std::abort();
  if (c.lookup(std::span<const fathom::PageHash>(&*r, 1)) != 1) std::abort();
  return 0;
}
