// MetaStore: RocksDB with tuned-down memory, synced WriteBatch commits, the chunk record codec,
// and the fault-injecting FileSystem wrapper used by crash tests.
#include "storage/meta_store.h"

#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/file_system.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <cstring>

#include "base/fs.h"
#include "storage/crc32c.h"
#include "storage/faults.h"

namespace fathom::storage {
namespace {

// ---- little-endian field codec (x86-64 is little-endian; the format says so explicitly) ----
template <typename T>
void put_le(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}
template <typename T>
T get_le(const char*& p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  p += sizeof(T);
  return v;
}

Status from_rocks(const rocksdb::Status& s, std::string_view what) {
  if (s.ok()) return {};
  if (s.IsNoSpace()) return resource_exhausted("{}: {}", what, s.ToString());
  if (s.IsCorruption()) return corrupt("{}: {}", what, s.ToString());
  return io_error("{}: {}", what, s.ToString());
}

rocksdb::IOStatus dead_status(const std::string& path) {
  return rocksdb::IOStatus::IOError("device lost power (simulated): " + path);
}

rocksdb::IOStatus to_io(const Status& s) {
  if (s.ok()) return rocksdb::IOStatus::OK();
  if (s.code() == StatusCode::kResourceExhausted) return rocksdb::IOStatus::NoSpace(s.message());
  return rocksdb::IOStatus::IOError(s.message());
}

using rocksdb::IODebugContext;
using rocksdb::IOOptions;
using rocksdb::IOStatus;
using rocksdb::Slice;

// A RocksDB file whose appends and syncs are reported to (and may be failed by) the injector.
class FaultWritableFile : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  FaultWritableFile(std::unique_ptr<rocksdb::FSWritableFile> t, std::string path, FaultInjector* f,
                    uint64_t size)
      : FSWritableFileOwnerWrapper(std::move(t)), path_(std::move(path)), faults_(f), size_(size) {}

  IOStatus Append(const Slice& data, const IOOptions& o, IODebugContext* d) override {
    auto gate = faults_->hold();
    if (auto s = faults_->check(FaultOp::kMetaWrite, path_); !s.ok()) return to_io(s);
    IOStatus s = target()->Append(data, o, d);
    if (s.ok()) faults_->meta_appended(path_, size_ += data.size());
    return s;
  }
  IOStatus Append(const Slice& data, const IOOptions& o, const rocksdb::DataVerificationInfo&,
                  IODebugContext* d) override {
    return Append(data, o, d);
  }
  IOStatus PositionedAppend(const Slice& data, uint64_t offset, const IOOptions& o,
                            IODebugContext* d) override {
    auto gate = faults_->hold();
    if (auto s = faults_->check(FaultOp::kMetaWrite, path_); !s.ok()) return to_io(s);
    IOStatus s = target()->PositionedAppend(data, offset, o, d);
    if (s.ok()) {
      size_ = std::max<uint64_t>(size_, offset + data.size());
      faults_->meta_appended(path_, size_);
    }
    return s;
  }
  IOStatus PositionedAppend(const Slice& data, uint64_t offset, const IOOptions& o,
                            const rocksdb::DataVerificationInfo&, IODebugContext* d) override {
    return PositionedAppend(data, offset, o, d);
  }
  IOStatus Truncate(uint64_t size, const IOOptions& o, IODebugContext* d) override {
    auto gate = faults_->hold();
    if (faults_->dead()) return dead_status(path_);
    IOStatus s = target()->Truncate(size, o, d);
    if (s.ok()) faults_->meta_appended(path_, size_ = size);
    return s;
  }
  IOStatus Sync(const IOOptions& o, IODebugContext* d) override { return sync(false, o, d); }
  IOStatus Fsync(const IOOptions& o, IODebugContext* d) override { return sync(true, o, d); }
  IOStatus Close(const IOOptions& o, IODebugContext* d) override {
    if (faults_->dead()) return dead_status(path_);
    return target()->Close(o, d);
  }

 private:
  IOStatus sync(bool full, const IOOptions& o, IODebugContext* d) {
    auto gate = faults_->hold();
    if (auto s = faults_->check(FaultOp::kMetaSync, path_); !s.ok()) return to_io(s);
    IOStatus s = full ? target()->Fsync(o, d) : target()->Sync(o, d);
    if (s.ok()) faults_->meta_synced(path_, size_);
    return s;
  }

  std::string path_;
  FaultInjector* faults_;
  uint64_t size_;
};

class FaultDirectory : public rocksdb::FSDirectory {
 public:
  FaultDirectory(std::unique_ptr<rocksdb::FSDirectory> t, std::string path, FaultInjector* f)
      : target_(std::move(t)), path_(std::move(path)), faults_(f) {}
  IOStatus Fsync(const IOOptions& o, IODebugContext* d) override {
    auto gate = faults_->hold();
    if (auto s = faults_->check(FaultOp::kMetaSync, path_); !s.ok()) return to_io(s);
    return target_->Fsync(o, d);
  }
  IOStatus FsyncWithDirOptions(const IOOptions& o, IODebugContext* d,
                               const rocksdb::DirFsyncOptions& x) override {
    auto gate = faults_->hold();
    if (auto s = faults_->check(FaultOp::kMetaSync, path_); !s.ok()) return to_io(s);
    return target_->FsyncWithDirOptions(o, d, x);
  }
  IOStatus Close(const IOOptions& o, IODebugContext* d) override { return target_->Close(o, d); }
  size_t GetUniqueId(char* id, size_t max_size) const override { return target_->GetUniqueId(id, max_size); }

 private:
  std::unique_ptr<rocksdb::FSDirectory> target_;
  std::string path_;
  FaultInjector* faults_;
};

class FaultFileSystem : public rocksdb::FileSystemWrapper {
 public:
  FaultFileSystem(std::shared_ptr<rocksdb::FileSystem> base, FaultInjector* f)
      : FileSystemWrapper(base), faults_(f) {}
  static const char* kClassName() { return "FathomFaultFileSystem"; }
  const char* Name() const override { return kClassName(); }

  IOStatus NewWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                           std::unique_ptr<rocksdb::FSWritableFile>* r, IODebugContext* d) override {
    if (faults_->dead()) return dead_status(f);
    std::unique_ptr<rocksdb::FSWritableFile> file;
    IOStatus s = target()->NewWritableFile(f, o, &file, d);
    if (!s.ok()) return s;
    faults_->meta_created(f);
    *r = std::make_unique<FaultWritableFile>(std::move(file), f, faults_, 0);
    return s;
  }
  IOStatus ReopenWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                              std::unique_ptr<rocksdb::FSWritableFile>* r, IODebugContext* d) override {
    if (faults_->dead()) return dead_status(f);
    uint64_t size = 0;
    (void)target()->GetFileSize(f, IOOptions(), &size, d);
    std::unique_ptr<rocksdb::FSWritableFile> file;
    IOStatus s = target()->ReopenWritableFile(f, o, &file, d);
    if (!s.ok()) return s;
    faults_->meta_synced(f, size);  // what exists at reopen is taken as durable
    *r = std::make_unique<FaultWritableFile>(std::move(file), f, faults_, size);
    return s;
  }
  IOStatus ReuseWritableFile(const std::string& f, const std::string& old, const rocksdb::FileOptions& o,
                             std::unique_ptr<rocksdb::FSWritableFile>* r, IODebugContext* d) override {
    if (faults_->dead()) return dead_status(f);
    std::unique_ptr<rocksdb::FSWritableFile> file;
    IOStatus s = target()->ReuseWritableFile(f, old, o, &file, d);
    if (!s.ok()) return s;
    faults_->meta_created(f);
    *r = std::make_unique<FaultWritableFile>(std::move(file), f, faults_, 0);
    return s;
  }
  IOStatus NewDirectory(const std::string& name, const IOOptions& o, std::unique_ptr<rocksdb::FSDirectory>* r,
                        IODebugContext* d) override {
    std::unique_ptr<rocksdb::FSDirectory> dir;
    IOStatus s = target()->NewDirectory(name, o, &dir, d);
    if (!s.ok()) return s;
    *r = std::make_unique<FaultDirectory>(std::move(dir), name, faults_);
    return s;
  }
  IOStatus RenameFile(const std::string& s, const std::string& t, const IOOptions& o,
                      IODebugContext* d) override {
    if (faults_->dead()) return dead_status(s);
    return target()->RenameFile(s, t, o, d);
  }
  IOStatus DeleteFile(const std::string& f, const IOOptions& o, IODebugContext* d) override {
    if (faults_->dead()) return dead_status(f);
    return target()->DeleteFile(f, o, d);
  }
  IOStatus LinkFile(const std::string& s, const std::string& t, const IOOptions& o,
                    IODebugContext* d) override {
    if (faults_->dead()) return dead_status(s);
    return target()->LinkFile(s, t, o, d);
  }
  IOStatus Truncate(const std::string& f, size_t size, const IOOptions& o, IODebugContext* d) override {
    if (faults_->dead()) return dead_status(f);
    return target()->Truncate(f, size, o, d);
  }

 private:
  FaultInjector* faults_;
};

}  // namespace

std::string encode_chunk_meta(const ChunkMeta& m) {
  std::string out;
  out.reserve(kChunkMetaBytes);
  put_le<uint8_t>(out, 1);  // record format
  put_le<uint8_t>(out, static_cast<uint8_t>(m.state));
  put_le<uint8_t>(out, m.size_class);
  put_le<uint8_t>(out, m.flags);
  put_le<uint32_t>(out, m.crc32c);
  put_le<uint64_t>(out, m.offset);
  put_le<uint32_t>(out, m.length);
  put_le<uint32_t>(out, m.chain_ver);
  put_le<uint64_t>(out, m.version);
  put_le<int64_t>(out, m.created_ms);
  put_le<int64_t>(out, m.expire_ms);
  put_le<uint64_t>(out, m.writer_client);
  put_le<uint64_t>(out, m.writer_request);
  put_le<uint32_t>(out, crc32c(out.data(), out.size()));
  return out;
}

Result<ChunkMeta> decode_chunk_meta(std::string_view bytes, std::string_view what) {
  if (bytes.size() != kChunkMetaBytes) {
    return corrupt("chunk metadata of '{}': {} bytes, expected {}", what, bytes.size(), kChunkMetaBytes);
  }
  const char* p = bytes.data();
  const uint32_t stored = [&] {
    const char* q = bytes.data() + kChunkMetaBytes - 4;
    return get_le<uint32_t>(q);
  }();
  if (crc32c(bytes.data(), kChunkMetaBytes - 4) != stored) {
    return corrupt("chunk metadata of '{}': record checksum mismatch", what);
  }
  const auto format = get_le<uint8_t>(p);
  if (format != 1) return corrupt("chunk metadata of '{}': record format {}, expected 1", what, format);
  ChunkMeta m;
  const auto state = get_le<uint8_t>(p);
  if (state != static_cast<uint8_t>(ChunkState::kCommitted)) {
    return corrupt("chunk metadata of '{}': unknown state {}", what, state);
  }
  m.state = ChunkState::kCommitted;
  m.size_class = get_le<uint8_t>(p);
  m.flags = get_le<uint8_t>(p);
  m.crc32c = get_le<uint32_t>(p);
  m.offset = get_le<uint64_t>(p);
  m.length = get_le<uint32_t>(p);
  m.chain_ver = get_le<uint32_t>(p);
  m.version = get_le<uint64_t>(p);
  m.created_ms = get_le<int64_t>(p);
  m.expire_ms = get_le<int64_t>(p);
  m.writer_client = get_le<uint64_t>(p);
  m.writer_request = get_le<uint64_t>(p);
  return m;
}

Result<std::unique_ptr<MetaStore>> MetaStore::open(MetaStoreParams params) {
  TRY(make_directories(params.dir));
  std::unique_ptr<MetaStore> store(new MetaStore());
  store->params_ = std::move(params);
  if (store->params_.faults != nullptr) {
    auto fs = std::make_shared<FaultFileSystem>(rocksdb::FileSystem::Default(), store->params_.faults);
    store->env_ = rocksdb::NewCompositeEnv(fs);
  }
  std::unique_lock lock(store->mu_);
  TRY(store->open_db());
  return store;
}

Status MetaStore::open_db() {
  if (db_ != nullptr) {
    (void)db_->Close();
    delete db_;
    db_ = nullptr;
  }
  rocksdb::Options options;
  options.create_if_missing = true;
  options.write_buffer_size = params_.write_buffer_bytes;
  options.max_write_buffer_number = 2;
  options.max_open_files = 256;
  options.keep_log_file_num = 2;
  options.max_manifest_file_size = 16u << 20;
  options.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  options.wal_recovery_mode = rocksdb::WALRecoveryMode::kPointInTimeRecovery;
  rocksdb::BlockBasedTableOptions table;
  table.block_size = 16 * 1024;
  options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  if (env_) options.env = env_.get();
  rocksdb::DB* db = nullptr;
  TRY(from_rocks(rocksdb::DB::Open(options, params_.dir, &db),
                 fmt::format("open chunk metadata '{}'", params_.dir)));
  db_ = db;
  return {};
}

MetaStore::~MetaStore() {
  if (db_ != nullptr) {
    (void)db_->Close();
    delete db_;
  }
}

Status MetaStore::ensure_open() {
  {
    std::shared_lock lock(mu_);
    if (db_ != nullptr) return {};
  }
  std::unique_lock lock(mu_);
  if (db_ != nullptr) return {};
  return open_db().with_context("chunk metadata was closed after an error; reopening");
}

Result<std::optional<std::string>> MetaStore::get(std::string_view key) {
  TRY(ensure_open());
  std::shared_lock lock(mu_);
  if (db_ == nullptr) return unavailable("chunk metadata '{}' is closed after an error", params_.dir);
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), rocksdb::Slice(key.data(), key.size()), &value);
  if (s.IsNotFound()) return std::optional<std::string>();
  TRY(from_rocks(s, fmt::format("metadata get in '{}'", params_.dir)));
  return std::optional<std::string>(std::move(value));
}

Status MetaStore::commit(std::span<const MetaWrite> writes) {
  rocksdb::WriteBatch batch;
  for (const MetaWrite& w : writes) {
    rocksdb::Status s = w.value ? batch.Put(w.key, *w.value) : batch.Delete(w.key);
    TRY(from_rocks(s, "metadata batch"));
  }
  rocksdb::WriteOptions options;
  options.sync = true;
  const std::string what = fmt::format("metadata commit in '{}'", params_.dir);
  Status first;
  TRY(ensure_open());
  {
    std::shared_lock lock(mu_);
    if (db_ == nullptr) return unavailable("chunk metadata '{}' is closed after an error", params_.dir);
    first = from_rocks(db_->Write(options, &batch), what);
    if (first.ok()) return {};
  }
  // RocksDB refuses further writes after a WAL error; reopening starts a new WAL (and replays
  // the old one, so the failed batch may turn out applied: rewriting it is harmless).
  std::unique_lock lock(mu_);
  if (Status s = open_db(); !s.ok()) return first.with_context(s.message());
  if (from_rocks(db_->Write(options, &batch), what).ok()) return {};
  return first;
}

Status MetaStore::scan(std::string_view prefix, std::string_view start,
                       FunctionRef<Status(std::string_view key, std::string_view value)> fn) {
  TRY(ensure_open());
  std::shared_lock lock(mu_);
  if (db_ == nullptr) return unavailable("chunk metadata '{}' is closed after an error", params_.dir);
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  const std::string_view from = start.empty() ? prefix : start;
  for (it->Seek(rocksdb::Slice(from.data(), from.size())); it->Valid(); it->Next()) {
    const rocksdb::Slice k = it->key();
    if (!k.starts_with(rocksdb::Slice(prefix.data(), prefix.size()))) break;
    const rocksdb::Slice v = it->value();
    TRY(fn(std::string_view(k.data(), k.size()), std::string_view(v.data(), v.size())));
  }
  return from_rocks(it->status(), fmt::format("metadata scan in '{}'", params_.dir));
}

}  // namespace fathom::storage
