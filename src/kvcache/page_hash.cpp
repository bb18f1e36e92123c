// Prefix hashes of KV pages: SHA-256 through OpenSSL's EVP interface (SHA-NI where the CPU has it).
// The exact byte layouts are documented in docs/kvcache.md and pinned by golden tests.
#include <openssl/evp.h>

#include <cstring>

#include "base/check.h"
#include "kvcache/kvcache.h"

namespace fathom {
namespace {

constexpr char kSeedTag[] = "fathom-kv-seed-1";    // 16 bytes, no terminator hashed
constexpr char kModelTag[] = "fathom-model-fp-1";  // 17 bytes

void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

// Incremental SHA-256; the context is created once per hash (hashing is per page, not per token).
class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) {
    CHECK(ctx_ != nullptr);
    CHECK(EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) == 1);
  }
  ~Sha256() { EVP_MD_CTX_free(ctx_); }
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t n) { CHECK(EVP_DigestUpdate(ctx_, data, n) == 1); }
  std::array<uint8_t, 32> finish() {
    std::array<uint8_t, 32> out{};
    unsigned int len = 0;
    CHECK(EVP_DigestFinal_ex(ctx_, out.data(), &len) == 1 && len == 32);
    return out;
  }

 private:
  EVP_MD_CTX* ctx_;
};

}  // namespace

ModelFingerprint kv_model_fingerprint(std::string_view config, std::string_view weights_digest) {
  Sha256 h;
  h.update(kModelTag, sizeof(kModelTag) - 1);
  uint8_t len[8];
  put_u64(len, config.size());
  h.update(len, 8);
  h.update(config.data(), config.size());
  put_u64(len, weights_digest.size());
  h.update(len, 8);
  h.update(weights_digest.data(), weights_digest.size());
  return h.finish();
}

PageHash kv_hash_seed(const ModelFingerprint& model, const MlaKvFormat& format) {
  uint8_t buf[16 + 32 + 5 * 4];
  std::memcpy(buf, kSeedTag, 16);
  std::memcpy(buf + 16, model.data(), 32);
  put_u32(buf + 48, kMlaKvLayoutVersion);
  put_u32(buf + 52, static_cast<uint32_t>(format.dtype));
  put_u32(buf + 56, static_cast<uint32_t>(format.page_tokens));
  put_u32(buf + 60, static_cast<uint32_t>(format.d_latent));
  put_u32(buf + 64, static_cast<uint32_t>(format.d_rope));
  Sha256 h;
  h.update(buf, sizeof(buf));
  return h.finish();
}

PageHash kv_page_hash(const PageHash& parent, std::span<const int32_t> tokens) {
  uint8_t buf[32 + 4 * 256];
  CHECK(tokens.size() <= 256);
  std::memcpy(buf, parent.data(), 32);
  for (size_t i = 0; i < tokens.size(); ++i) put_u32(buf + 32 + 4 * i, static_cast<uint32_t>(tokens[i]));
  Sha256 h;
  h.update(buf, 32 + 4 * tokens.size());
  return h.finish();
}

void kv_hash_chain(const PageHash& seed, std::span<const int32_t> tokens, int page_tokens,
                   std::vector<PageHash>* out) {
  CHECK(page_tokens > 0 && page_tokens <= 256);
  out->clear();
  PageHash parent = seed;
  for (size_t begin = 0; begin + static_cast<size_t>(page_tokens) <= tokens.size(); begin += page_tokens) {
    parent = kv_page_hash(parent, tokens.subspan(begin, static_cast<size_t>(page_tokens)));
    out->push_back(parent);
  }
}

std::string page_hash_hex(const PageHash& hash) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s(64, '0');
  for (size_t i = 0; i < 32; ++i) {
    s[2 * i] = kHex[hash[i] >> 4];
    s[2 * i + 1] = kHex[hash[i] & 15];
  }
  return s;
}

}  // namespace fathom
