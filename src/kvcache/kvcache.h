// KvCache: the paged MLA latent cache the engine keeps per model. For every layer it holds pages of
// `page_tokens` tokens (kernels/mla_kv_format.h: [d_latent | d_rope] per token, bf16 or fp8); a page
// id names the same slot in every layer's pool, so a sequence has one block table for all layers.
//
//  - Capacity is set once in bytes; all memory (pools, page metadata, block tables, the hash
//    index) is allocated at create(). Nothing is allocated per token or per page afterwards.
//  - Pages are reference counted: fork() and prefix hits share pages between sequences; a write
//    into a page that is shared or published goes to a private copy (copy-on-write, at append()).
//  - A full page whose 64 tokens are written in every layer is published under its prefix hash
//    (page_hash.h: SHA-256 chained over the token ids, seeded with the model fingerprint and the
//    format). When no sequence references it, it stays cached, evictable in LRU order; allocation
//    takes free pages first, then evicts the least recently released cached page.
//  - attach_prefix() maps the longest cached run of a new sequence's full pages; lookup() answers
//    the same for a chain of hashes; export_page()/import_page() move a published page (all layers)
//    to and from the storage tier in a self-describing, hash-verified blob (docs/kvcache.md).
//
// Flow per step: append(seq, tokens) reserves slots and records token ids; the model then calls
// write(seq, layer, pos, values) for each layer (values in f32, quantised here) and reads pages
// through layer_view() + block tables with the decode kernel (kernels/mla_decode.h).
//
// Thread safety: none inside; the engine calls it from one thread. Kernels may read page bytes
// (layer_view) from any thread while no mutating call runs.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "kernels/mla_decode.h"
#include "kernels/mla_kv_format.h"

namespace fathom {

// ---- page identity (docs/kvcache.md, "Prefix hash") ----
// A page's hash is SHA-256(parent hash || its token ids as little-endian int32); the chain starts
// at a seed that hashes the model fingerprint, the layout version, the KV dtype, the page size and
// the widths, so pages of another model or format can never match. Deterministic across
// processes, machines and restarts; the engine's prefix cache and the storage tier key pages by it.
using PageHash = std::array<uint8_t, 32>;
using ModelFingerprint = std::array<uint8_t, 32>;

// SHA-256 of "fathom-model-fp-1", then the config text and the weights digest, each preceded by
// its length (u64 little-endian). The model passes its config.json and a digest of its weights.
ModelFingerprint kv_model_fingerprint(std::string_view config, std::string_view weights_digest);
PageHash kv_hash_seed(const ModelFingerprint& model, const MlaKvFormat& format);
// tokens.size() must be format.page_tokens (CHECKed by callers that take input: see kv_hash_chain).
PageHash kv_page_hash(const PageHash& parent, std::span<const int32_t> tokens);
// Hashes of the full pages of `tokens` (tokens.size() / page_tokens of them) into `out`.
void kv_hash_chain(const PageHash& seed, std::span<const int32_t> tokens, int page_tokens,
                   std::vector<PageHash>* out);
std::string page_hash_hex(const PageHash& hash);

using SeqId = int32_t;

struct KvCacheOptions {
  int n_layers = 0;
  MlaKvFormat format;
  ModelFingerprint model_fingerprint{};  // kv_model_fingerprint(config, weights digest)
  uint64_t capacity_bytes = 0;           // page bytes of all layers; pages = capacity / page_bytes_all_layers
  int max_sequences = 256;
  int64_t max_tokens_per_sequence = 163840;  // block-table width = ceil(this / page_tokens)
  bool populate = false;                     // fault every pool page in at create (no first-touch later)
};

struct KvCacheStats {
  int64_t pages_total = 0;
  int64_t pages_free = 0;    // never used or released unpublished
  int64_t pages_cached = 0;  // published, unreferenced: reusable by prefix hits, evictable
  int64_t pages_used = 0;    // referenced by at least one sequence
  int64_t pages_published = 0;
  int sequences = 0;
  int64_t prefix_hit_pages = 0;  // pages attached by attach_prefix since create
  int64_t evictions = 0;
  int64_t cow_copies = 0;
};

class KvCache {
 public:
  static Result<std::unique_ptr<KvCache>> create(const KvCacheOptions& options);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvCacheOptions& options() const;
  const MlaKvFormat& format() const { return options().format; }
  int n_layers() const { return options().n_layers; }
  int64_t n_pages() const;
  int64_t max_pages_per_sequence() const;
  // Bytes one page occupies across all layers.
  int64_t page_bytes_all_layers() const;
  // Pages an allocation can get now: free plus cached (evictable).
  int64_t available_pages() const;
  KvCacheStats stats() const;
  // The root of every page-hash chain of this cache (model fingerprint + format).
  const PageHash& hash_seed() const;

  // ---- sequences ----
  Result<SeqId> add_sequence();
  // A new sequence sharing every page of `parent` (its partial last page too, copied on the next
  // append of either). Fork after every layer of the appended tokens is written: a shared page
  // cannot be written (kFailedPrecondition).
  Result<SeqId> fork(SeqId parent);
  // Drops the sequence's references; its published pages stay cached.
  Status free_sequence(SeqId seq);
  // Keeps the first n_tokens (speculative tokens rejected, a request rewound).
  Status truncate(SeqId seq, int64_t n_tokens);
  Result<int64_t> seq_len(SeqId seq) const;
  Result<std::span<const int32_t>> block_table(SeqId seq) const;
  // Pages append(seq, n_tokens more) would allocate, counting a copy-on-write of the last page.
  Result<int64_t> pages_needed(SeqId seq, int64_t n_tokens) const;

  // ---- prefix reuse ----
  // For an empty sequence: attaches the longest run of cached pages matching the full pages of
  // `tokens` (pass all prompt tokens but the last, so one token is left to compute). Returns the
  // number of tokens attached (a multiple of page_tokens); they count as written in every layer.
  Result<int64_t> attach_prefix(SeqId seq, std::span<const int32_t> tokens);
  // How many leading hashes of `chain` name pages present here (published, used or cached).
  int64_t lookup(std::span<const PageHash> chain) const;

  // ---- writing and reading ----
  // Reserves slots for `tokens` at the end of the sequence (allocating pages, copying a shared or
  // published last page first) and records their ids. All or nothing: kResourceExhausted when the
  // pages are not there, kOutOfRange past max_tokens_per_sequence.
  Status append(SeqId seq, std::span<const int32_t> tokens);
  // Writes values [n, d_latent + d_rope] (f32; quantised to the cache dtype) for positions
  // [pos, pos + n) of one layer. Positions must be appended, and either the next unwritten ones
  // of that layer or rewrites of the sequence's own unpublished pages.
  Status write(SeqId seq, int layer, int64_t pos, std::span<const float> values);
  // Decodes positions [pos, pos + n) of one layer to f32 [n, d_latent + d_rope] (exact).
  Status read(SeqId seq, int layer, int64_t pos, int64_t n, std::span<float> out) const;

  // ---- the decode kernel's view ----
  MlaCacheView layer_view(int layer) const;
  // Block tables [seqs.size(), max_pages] (unused entries -1) and lengths for a batch.
  Status fill_batch(std::span<const SeqId> seqs, int64_t max_pages, int32_t* block_tables,
                    int32_t* seqlens) const;

  // ---- the storage tier ----
  // Size of an exported page blob: header, token ids, then every layer's page bytes.
  int64_t export_blob_bytes() const;
  // Copies the published page `hash` (all layers) into `out` (export_blob_bytes()).
  Status export_page(const PageHash& hash, std::span<uint8_t> out) const;
  // Adds a page from a blob as a cached page (evictable, attachable by attach_prefix). `parent`
  // is the hash before it in the chain (hash_seed() for the first page); the blob's hash must
  // equal kv_page_hash(parent, its tokens) and its format this cache's. Returns the page hash;
  // importing a page already present only marks it most recently used.
  Result<PageHash> import_page(const PageHash& parent, std::span<const uint8_t> blob);

 private:
  struct Impl;
  explicit KvCache(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fathom
