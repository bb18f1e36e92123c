// KvCache: the KV-cache API over StorageClient. A block is an evictable chunk "K"+key written in
// kCreate mode (blocks are immutable: the same key always names the same bytes, so a second put
// is a no-op); placement hashes the id, so every call goes straight to the target.
#include <cstring>

#include "storage/storage.h"

namespace fathom::storage {

std::string kv_key_hex(const KvKey& key) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s(64, '0');
  for (size_t i = 0; i < key.size(); ++i) {
    s[2 * i] = kHex[key[i] >> 4];
    s[2 * i + 1] = kHex[key[i] & 15];
  }
  return s;
}

Result<KvKey> parse_kv_key(std::string_view hex) {
  if (hex.size() != 64) return invalid_argument("KV key '{}': {} hex digits, expected 64", hex, hex.size());
  KvKey key{};
  for (size_t i = 0; i < 64; ++i) {
    const char c = hex[i];
    int v = -1;
    if (c >= '0' && c <= '9') v = c - '0';
    if (c >= 'a' && c <= 'f') v = c - 'a' + 10;
    if (c >= 'A' && c <= 'F') v = c - 'A' + 10;
    if (v < 0) return invalid_argument("KV key '{}': '{}' at {} is not a hex digit", hex, c, i);
    key[i / 2] = static_cast<uint8_t>(key[i / 2] | (v << (i % 2 ? 0 : 4)));
  }
  return key;
}

std::string KvCache::chunk_id(const KvKey& key) {
  std::string id(1 + key.size(), 'K');
  std::memcpy(id.data() + 1, key.data(), key.size());
  return id;
}

Status KvCache::put(const KvKey& key, std::span<const uint8_t> value, uint32_t ttl_s) {
  return batch_put(std::span(&key, 1), std::span(&value, 1), ttl_s)[0];
}

std::vector<Status> KvCache::batch_put(std::span<const KvKey> keys,
                                       std::span<const std::span<const uint8_t>> values, uint32_t ttl_s) {
  std::vector<Status> out(keys.size());
  if (keys.size() != values.size()) {
    out.assign(keys.size(), invalid_argument("batch_put: {} keys but {} values", keys.size(), values.size()));
    return out;
  }
  std::vector<std::string> ids(keys.size());
  std::vector<ChunkWrite> items(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    ids[i] = chunk_id(keys[i]);
    items[i] = ChunkWrite{
        .id = ids[i], .data = values[i], .mode = ChunkMode::kCreate, .evictable = true, .ttl_s = ttl_s};
  }
  std::vector<ChunkWriteResult> results(keys.size());
  client_.write(items, results);
  for (size_t i = 0; i < keys.size(); ++i) out[i] = results[i].status;
  return out;
}

Result<std::optional<std::vector<uint8_t>>> KvCache::get(const KvKey& key, uint32_t lease_ms) {
  const std::string id = chunk_id(key);
  const ChunkRead item{.id = id, .lease_ms = lease_ms};
  ChunkReadResult r;
  client_.read(std::span(&item, 1), std::span(&r, 1));
  if (r.status.code() == StatusCode::kNotFound) return std::optional<std::vector<uint8_t>>();
  if (!r.status.ok()) return r.status.with_context(fmt::format("kv get {}", kv_key_hex(key)));
  return std::optional<std::vector<uint8_t>>(std::move(r.data));
}

std::vector<KvGetResult> KvCache::batch_get(std::span<const KvKey> keys,
                                            std::span<const std::span<uint8_t>> dests, uint32_t lease_ms) {
  std::vector<KvGetResult> out(keys.size());
  if (keys.size() != dests.size()) {
    for (auto& r : out)
      r.status = invalid_argument("batch_get: {} keys but {} buffers", keys.size(), dests.size());
    return out;
  }
  std::vector<std::string> ids(keys.size());
  std::vector<ChunkRead> items(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    ids[i] = chunk_id(keys[i]);
    if (dests[i].empty()) {
      out[i].status = invalid_argument("batch_get: empty buffer for key {}", kv_key_hex(keys[i]));
    }
    items[i] = ChunkRead{.id = ids[i], .lease_ms = lease_ms, .dest = dests[i]};
  }
  std::vector<ChunkReadResult> results(keys.size());
  client_.read(items, results);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!out[i].status.ok()) continue;
    out[i].status = results[i].status;
    out[i].length = results[i].status.ok() ? results[i].length : 0;
  }
  return out;
}

Result<std::vector<bool>> KvCache::exists(std::span<const KvKey> keys, uint32_t lease_ms) {
  std::vector<std::string> ids(keys.size());
  std::vector<std::string_view> views(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    ids[i] = chunk_id(keys[i]);
    views[i] = ids[i];
  }
  std::vector<ChunkStat> stats(keys.size());
  client_.stat(views, stats, lease_ms);
  std::vector<bool> out(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (stats[i].status.ok()) {
      out[i] = true;
    } else if (stats[i].status.code() != StatusCode::kNotFound) {
      return stats[i].status.with_context(fmt::format("kv exists {}", kv_key_hex(keys[i])));
    }
  }
  return out;
}

Result<size_t> KvCache::longest_prefix(std::span<const KvKey> chain, uint32_t lease_ms) {
  const std::vector<bool> hit = TRY(exists(chain, lease_ms));
  size_t n = 0;
  while (n < hit.size() && hit[n]) ++n;
  return n;
}

Result<size_t> KvCache::remove(std::span<const KvKey> keys) {
  std::vector<std::string> ids(keys.size());
  std::vector<std::string_view> views(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    ids[i] = chunk_id(keys[i]);
    views[i] = ids[i];
  }
  std::unique_ptr<bool[]> existed(new bool[keys.size()]());
  TRY(client_.remove(views, std::span(existed.get(), keys.size())));
  size_t n = 0;
  for (size_t i = 0; i < keys.size(); ++i) n += existed[i] ? 1 : 0;
  return n;
}

}  // namespace fathom::storage
