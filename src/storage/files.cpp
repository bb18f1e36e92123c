// FileStore: files chunked over the targets. A file version is an inode record (the chunk
// "M"+path, JSON, format 1: size, chunk size, whole-file CRC32C, layout) and its data chunks
// "F"+inode id+chunk index. Writing the inode record is the commit point: data chunks go first,
// so a reader sees the old file or the new one, never a mix; the old version's chunks are
// removed after the switch. Chunk i lives on layout[XXH3(chunk id) mod |layout|], the layout
// being the target uuids when the file was written, so adding targets or moving servers to other
// addresses later moves nothing.
// Not done: garbage collection of chunks orphaned by a client that died mid-put.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

#include "base/log.h"
#include "storage/crc32c.h"
#include "storage/storage.h"

namespace fathom::storage {
namespace {

constexpr size_t kMaxPathBytes = 1000;

struct Inode {
  std::string path;
  std::string id;  // 16 random bytes
  uint64_t size = 0;
  uint32_t chunk_bytes = 0;
  uint64_t chunks = 0;
  uint32_t crc32c = 0;
  int64_t mtime_ms = 0;
  std::vector<std::string> layout;  // target uuids
};

std::string hex(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (unsigned char c : bytes) {
    s.push_back(kHex[c >> 4]);
    s.push_back(kHex[c & 15]);
  }
  return s;
}

std::string inode_chunk(std::string_view path) {
  return "M" + std::string(path);
}

std::string data_chunk(const std::string& inode_id, uint64_t index) {
  std::string id = "F" + inode_id;
  for (int s = 56; s >= 0; s -= 8) id.push_back(static_cast<char>(index >> s));  // big-endian: ordered
  return id;
}

Status validate_path(std::string_view path) {
  if (path.empty() || path.size() > kMaxPathBytes) {
    return invalid_argument("remote path of {} bytes (expected 1..{})", path.size(), kMaxPathBytes);
  }
  if (path.find('\0') != std::string_view::npos) return invalid_argument("remote path contains a NUL byte");
  return {};
}

std::string encode_inode(const Inode& n) {
  nlohmann::json layout = n.layout;
  nlohmann::json j = {
      {"format", 1},        {"inode", hex(n.id)}, {"size", n.size},         {"chunk_bytes", n.chunk_bytes},
      {"chunks", n.chunks}, {"crc32c", n.crc32c}, {"mtime_ms", n.mtime_ms}, {"layout", layout}};
  return j.dump();
}

Result<Inode> decode_inode(std::string_view text, const std::string& path) {
  Inode n;
  n.path = path;
  try {
    const auto j = nlohmann::json::parse(text);
    if (j.at("format") != 1)
      return corrupt("inode of '{}': format {} (expected 1)", path, j.at("format").dump());
    const std::string id_hex = j.at("inode").get<std::string>();
    if (id_hex.size() != 32) return corrupt("inode of '{}': bad inode id", path);
    for (size_t i = 0; i < 32; i += 2)
      n.id.push_back(static_cast<char>(std::stoi(id_hex.substr(i, 2), nullptr, 16)));
    n.size = j.at("size").get<uint64_t>();
    n.chunk_bytes = j.at("chunk_bytes").get<uint32_t>();
    n.chunks = j.at("chunks").get<uint64_t>();
    n.crc32c = j.at("crc32c").get<uint32_t>();
    n.mtime_ms = j.at("mtime_ms").get<int64_t>();
    n.layout = j.at("layout").get<std::vector<std::string>>();
  } catch (const std::exception& ex) {
    return corrupt("inode of '{}': {}", path, ex.what());
  }
  if (n.chunk_bytes < 4096 || n.chunk_bytes > (64u << 20) || n.layout.empty() ||
      n.chunks != (n.size + n.chunk_bytes - 1) / n.chunk_bytes) {
    return corrupt("inode of '{}': inconsistent size {} / chunk size {} / {} chunks", path, n.size,
                   n.chunk_bytes, n.chunks);
  }
  return n;
}

FileInfo to_info(const Inode& n) {
  return FileInfo{n.path, n.size, n.chunk_bytes, n.chunks, n.crc32c, n.mtime_ms, hex(n.id)};
}

// Index into client.targets() of every layout entry.
Result<std::vector<size_t>> resolve_layout(const StorageClient& client, const Inode& n) {
  std::vector<size_t> out;
  const auto& table = client.targets();
  for (const std::string& uuid : n.layout) {
    auto it = std::find_if(table.begin(), table.end(), [&](const TargetInfo& t) { return t.uuid == uuid; });
    if (it == table.end()) {
      return unavailable("'{}' has chunks on target {}, which none of the connected servers serves", n.path,
                         uuid);
    }
    out.push_back(static_cast<size_t>(it - table.begin()));
  }
  return out;
}

size_t chunk_target(const std::vector<size_t>& layout, const std::string& id) {
  return layout[XXH3_64bits(id.data(), id.size()) % layout.size()];
}

Result<std::optional<Inode>> read_inode(StorageClient& client, const std::string& path) {
  const std::string id = inode_chunk(path);
  const ChunkRead item{.id = id};
  ChunkReadResult r;
  client.read(std::span(&item, 1), std::span(&r, 1));
  if (r.status.code() == StatusCode::kNotFound) return std::optional<Inode>();
  if (!r.status.ok()) return r.status.with_context(fmt::format("inode of '{}'", path));
  Inode n =
      TRY(decode_inode(std::string_view(reinterpret_cast<const char*>(r.data.data()), r.data.size()), path));
  return std::optional<Inode>(std::move(n));
}

// Removes the data chunks of an inode, in batches.
Status remove_chunks(StorageClient& client, const Inode& n) {
  const std::vector<size_t> layout = TRY(resolve_layout(client, n));
  for (uint64_t first = 0; first < n.chunks; first += 1024) {
    const uint64_t last = std::min<uint64_t>(n.chunks, first + 1024);
    std::vector<std::string> ids;
    std::vector<size_t> targets;
    for (uint64_t i = first; i < last; ++i) {
      ids.push_back(data_chunk(n.id, i));
      targets.push_back(chunk_target(layout, ids.back()));
    }
    std::vector<std::string_view> views(ids.begin(), ids.end());
    std::unique_ptr<bool[]> existed(new bool[ids.size()]());
    TRY(client.remove(views, std::span(existed.get(), ids.size()), targets));
  }
  return {};
}

// Runs body(batch) for batches [0, n_batches) on `parallel` threads; the first error stops the rest.
Status parallel_batches(uint64_t n_batches, int parallel, const std::function<Status(uint64_t, int)>& body) {
  std::atomic<uint64_t> next{0};
  std::mutex mu;
  Status first;
  std::atomic<bool> failed{false};
  auto worker = [&](int w) {
    for (uint64_t b; !failed && (b = next.fetch_add(1)) < n_batches;) {
      Status s = body(b, w);
      if (!s.ok()) {
        std::lock_guard lock(mu);
        if (first.ok()) first = s;
        failed = true;
      }
    }
  };
  const int n = static_cast<int>(std::min<uint64_t>(std::max(parallel, 1), std::max<uint64_t>(n_batches, 1)));
  std::vector<std::thread> threads;
  for (int w = 1; w < n; ++w) threads.emplace_back(worker, w);
  worker(0);
  for (auto& t : threads) t.join();
  return first;
}

using ReadAt = std::function<Status(uint64_t offset, uint8_t* dst, size_t n)>;
using WriteAt = std::function<Status(uint64_t offset, const uint8_t* src, size_t n)>;

Status put_impl(StorageClient& client, const FileStoreParams& params, uint64_t size, const ReadAt& read_at,
                const std::string& remote) {
  TRY(validate_path(remote));
  if (params.chunk_bytes < 4096 || params.chunk_bytes > (64u << 20)) {
    return invalid_argument("chunk size {} (expected 4 KiB .. 64 MiB)", params.chunk_bytes);
  }
  const std::optional<Inode> old = TRY(read_inode(client, remote));
  Inode n;
  n.path = remote;
  std::mt19937_64 rng(std::random_device{}() ^
                      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  for (int i = 0; i < 2; ++i) {
    const uint64_t v = rng();
    n.id.append(reinterpret_cast<const char*>(&v), 8);
  }
  n.size = size;
  n.chunk_bytes = params.chunk_bytes;
  n.chunks = (size + n.chunk_bytes - 1) / n.chunk_bytes;
  n.mtime_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count();
  std::vector<size_t> layout;
  for (size_t t = 0; t < client.targets().size(); ++t) {
    n.layout.push_back(client.targets()[t].uuid);
    layout.push_back(t);
  }
  const uint64_t batch = std::max(params.batch, 1);
  std::vector<uint32_t> crcs(n.chunks);
  std::vector<std::vector<uint8_t>> buffers(std::max(params.parallel, 1));
  Status s =
      parallel_batches((n.chunks + batch - 1) / batch, params.parallel, [&](uint64_t b, int w) -> Status {
        const uint64_t first = b * batch, last = std::min(n.chunks, first + batch);
        buffers[w].resize(batch * n.chunk_bytes);
        std::vector<std::string> ids;
        std::vector<ChunkWrite> items;
        for (uint64_t i = first; i < last; ++i) {
          const size_t len = static_cast<size_t>(std::min<uint64_t>(n.chunk_bytes, size - i * n.chunk_bytes));
          uint8_t* buf = buffers[w].data() + (i - first) * n.chunk_bytes;
          TRY(read_at(i * n.chunk_bytes, buf, len));
          crcs[i] = crc32c(buf, len);
          ids.push_back(data_chunk(n.id, i));
        }
        for (uint64_t i = first; i < last; ++i) {
          const size_t len = static_cast<size_t>(std::min<uint64_t>(n.chunk_bytes, size - i * n.chunk_bytes));
          const std::string& id = ids[i - first];
          items.push_back(ChunkWrite{.id = id,
                                     .data = std::span(buffers[w].data() + (i - first) * n.chunk_bytes, len),
                                     .target = chunk_target(layout, id)});
        }
        std::vector<ChunkWriteResult> results(items.size());
        client.write(items, results);
        for (size_t k = 0; k < results.size(); ++k) {
          if (!results[k].status.ok())
            return results[k].status.with_context(fmt::format("chunk {} of '{}'", first + k, remote));
        }
        return {};
      });
  if (!s.ok()) {
    (void)remove_chunks(client, n);  // best effort; what remains is unreferenced garbage
    return s;
  }
  for (uint64_t i = 0; i < n.chunks; ++i) {
    const uint64_t len = std::min<uint64_t>(n.chunk_bytes, size - i * n.chunk_bytes);
    n.crc32c = i == 0 ? crcs[0] : crc32c_combine(n.crc32c, crcs[i], len);
  }
  const std::string record = encode_inode(n);
  const std::string id = inode_chunk(remote);
  const ChunkWrite w{.id = id,
                     .data = std::span(reinterpret_cast<const uint8_t*>(record.data()), record.size())};
  ChunkWriteResult r;
  client.write(std::span(&w, 1), std::span(&r, 1));
  if (!r.status.ok()) {
    (void)remove_chunks(client, n);
    return r.status.with_context(fmt::format("commit '{}'", remote));
  }
  if (old) {
    if (Status rs = remove_chunks(client, *old); !rs.ok()) {
      log_warn("storage: replaced '{}' but its old chunks remain: {}", remote, rs.to_string());
    }
  }
  return {};
}

Status get_impl(StorageClient& client, const FileStoreParams& params, const Inode& n,
                const WriteAt& write_at) {
  const std::vector<size_t> layout = TRY(resolve_layout(client, n));
  const uint64_t batch = std::max(params.batch, 1);
  std::vector<uint32_t> crcs(n.chunks);
  std::vector<std::vector<uint8_t>> buffers(std::max(params.parallel, 1));
  TRY(parallel_batches((n.chunks + batch - 1) / batch, params.parallel, [&](uint64_t b, int w) -> Status {
    const uint64_t first = b * batch, last = std::min(n.chunks, first + batch);
    buffers[w].resize(batch * n.chunk_bytes);
    std::vector<std::string> ids;
    for (uint64_t i = first; i < last; ++i) ids.push_back(data_chunk(n.id, i));
    std::vector<ChunkRead> items;
    for (uint64_t i = first; i < last; ++i) {
      items.push_back(
          ChunkRead{.id = ids[i - first],
                    .dest = std::span(buffers[w].data() + (i - first) * n.chunk_bytes, n.chunk_bytes),
                    .target = chunk_target(layout, ids[i - first])});
    }
    std::vector<ChunkReadResult> results(items.size());
    client.read(items, results);
    for (uint64_t i = first; i < last; ++i) {
      const ChunkReadResult& r = results[i - first];
      const uint64_t want = std::min<uint64_t>(n.chunk_bytes, n.size - i * n.chunk_bytes);
      if (r.status.code() == StatusCode::kNotFound) {
        return corrupt("'{}': chunk {} is missing (removed or replaced while reading?)", n.path, i);
      }
      if (!r.status.ok()) return r.status.with_context(fmt::format("chunk {} of '{}'", i, n.path));
      if (r.length != want)
        return corrupt("'{}': chunk {} holds {} bytes, expected {}", n.path, i, r.length, want);
      const uint8_t* buf = buffers[w].data() + (i - first) * n.chunk_bytes;
      crcs[i] = crc32c(buf, want);
      TRY(write_at(i * n.chunk_bytes, buf, want));
    }
    return {};
  }));
  uint32_t crc = 0;
  for (uint64_t i = 0; i < n.chunks; ++i) {
    crc = i == 0
              ? crcs[0]
              : crc32c_combine(crc, crcs[i], std::min<uint64_t>(n.chunk_bytes, n.size - i * n.chunk_bytes));
  }
  if (crc != n.crc32c)
    return corrupt("'{}': whole-file CRC32C {:08x}, the inode says {:08x}", n.path, crc, n.crc32c);
  return {};
}

}  // namespace

Status FileStore::put(const std::string& local, const std::string& remote) {
  const int fd = ::open(local.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno_status(errno, fmt::format("open '{}'", local));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument("'{}' is not a regular file", local);
  }
  Status s = put_impl(
      client_, params_, static_cast<uint64_t>(st.st_size),
      [&](uint64_t off, uint8_t* dst, size_t n) -> Status {
        size_t done = 0;
        while (done < n) {
          const ssize_t r = ::pread(fd, dst + done, n - done, static_cast<off_t>(off + done));
          if (r < 0 && errno == EINTR) continue;
          if (r < 0) return errno_status(errno, fmt::format("read '{}'", local));
          if (r == 0) return io_error("'{}' shrank while being uploaded", local);
          done += static_cast<size_t>(r);
        }
        return {};
      },
      remote);
  ::close(fd);
  return s;
}

Status FileStore::put_bytes(std::span<const uint8_t> data, const std::string& remote) {
  return put_impl(
      client_, params_, data.size(),
      [&](uint64_t off, uint8_t* dst, size_t n) -> Status {
        std::memcpy(dst, data.data() + off, n);
        return {};
      },
      remote);
}

Status FileStore::get(const std::string& remote, const std::string& local) {
  TRY(validate_path(remote));
  const std::optional<Inode> n = TRY(read_inode(client_, remote));
  if (!n) return not_found("remote file '{}' not found", remote);
  const std::string tmp = local + ".fathom-part";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_status(errno, fmt::format("create '{}'", tmp));
  Status s;
  if (::ftruncate(fd, static_cast<off_t>(n->size)) != 0)
    s = errno_status(errno, fmt::format("size '{}'", tmp));
  if (s.ok()) {
    s = get_impl(client_, params_, *n, [&](uint64_t off, const uint8_t* src, size_t len) -> Status {
      size_t done = 0;
      while (done < len) {
        const ssize_t w = ::pwrite(fd, src + done, len - done, static_cast<off_t>(off + done));
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return errno_status(errno, fmt::format("write '{}'", tmp));
        done += static_cast<size_t>(w);
      }
      return {};
    });
  }
  if (s.ok() && ::fsync(fd) != 0) s = errno_status(errno, fmt::format("fsync '{}'", tmp));
  ::close(fd);
  if (s.ok() && ::rename(tmp.c_str(), local.c_str()) != 0)
    s = errno_status(errno, fmt::format("rename to '{}'", local));
  if (!s.ok()) ::unlink(tmp.c_str());
  return s;
}

Result<std::vector<uint8_t>> FileStore::get_bytes(const std::string& remote) {
  TRY(validate_path(remote));
  const std::optional<Inode> n = TRY(read_inode(client_, remote));
  if (!n) return not_found("remote file '{}' not found", remote);
  std::vector<uint8_t> out(n->size);
  TRY(get_impl(client_, params_, *n, [&](uint64_t off, const uint8_t* src, size_t len) -> Status {
    std::memcpy(out.data() + off, src, len);
    return {};
  }));
  return out;
}

Result<std::vector<FileInfo>> FileStore::list(std::string_view prefix) {
  std::vector<FileInfo> out;
  const std::string key_prefix = inode_chunk(prefix);
  for (size_t t = 0; t < client_.targets().size(); ++t) {
    std::string after;
    for (bool more = true; more;) {
      const auto page = TRY(client_.list(t, key_prefix, after, 1000, &more));
      if (page.empty()) break;
      after = page.back().id;
      std::vector<ChunkRead> items;
      for (const ChunkListing& l : page) items.push_back(ChunkRead{.id = l.id, .target = t});
      std::vector<ChunkReadResult> results(items.size());
      client_.read(items, results);
      for (size_t i = 0; i < page.size(); ++i) {
        if (results[i].status.code() == StatusCode::kNotFound) continue;  // removed meanwhile
        TRY(results[i].status);
        const std::string path = page[i].id.substr(1);
        const Inode n = TRY(decode_inode(
            std::string_view(reinterpret_cast<const char*>(results[i].data.data()), results[i].data.size()),
            path));
        out.push_back(to_info(n));
      }
    }
  }
  std::sort(out.begin(), out.end(), [](const FileInfo& a, const FileInfo& b) { return a.path < b.path; });
  return out;
}

Status FileStore::remove(const std::string& remote) {
  TRY(validate_path(remote));
  const std::optional<Inode> n = TRY(read_inode(client_, remote));
  if (!n) return not_found("remote file '{}' not found", remote);
  const std::string id = inode_chunk(remote);
  const std::string_view ids[] = {id};
  bool existed = false;
  TRY(client_.remove(ids, std::span(&existed, 1)));
  return remove_chunks(client_, *n);
}

Result<FileInfo> FileStore::stat(const std::string& remote) {
  TRY(validate_path(remote));
  const std::optional<Inode> n = TRY(read_inode(client_, remote));
  if (!n) return not_found("remote file '{}' not found", remote);
  return to_info(*n);
}

}  // namespace fathom::storage
