// safetensors reader/writer and sharded checkpoints.
#include "formats/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "base/log.h"
#include "formats/json_util.h"

namespace fathom {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit

struct DTypeName {
  const char* name;
  DType dtype;
};
constexpr DTypeName kDTypeNames[] = {
    {"F64", DType::kF64},   {"F32", DType::kF32},         {"F16", DType::kF16},
    {"BF16", DType::kBF16}, {"F8_E4M3", DType::kF8E4M3}, {"F8_E5M2", DType::kF8E5M2},
    {"I64", DType::kI64},   {"I32", DType::kI32},         {"I16", DType::kI16},
    {"I8", DType::kI8},     {"U8", DType::kU8},           {"U16", DType::kU16},
    {"U32", DType::kU32},   {"U64", DType::kU64},         {"BOOL", DType::kBool},
};

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

Result<TensorEntry> parse_entry(const std::string& path, const std::string& name, const nlohmann::json& j,
                                uint64_t data_bytes, uint64_t data_start) {
  auto where = [&] { return fmt::format("{}: tensor '{}'", path, name); };
  if (!j.is_object()) return corrupt("{}: entry is not an object", where());
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!j.contains(field)) return corrupt("{}: missing '{}'", where(), field);
  }
  TensorEntry e;
  e.name = name;
  if (!j["dtype"].is_string()) return corrupt("{}: 'dtype' is not a string", where());
  auto dtype = safetensors_dtype(j["dtype"].get<std::string>());
  if (!dtype.ok()) return dtype.status().with_context(where());
  e.dtype = *dtype;
  if (!j["shape"].is_array()) return corrupt("{}: 'shape' is not an array", where());
  if (j["shape"].size() > kMaxDims) return corrupt("{}: rank {} exceeds {}", where(), j["shape"].size(), kMaxDims);
  for (const auto& d : j["shape"]) {
    if (!d.is_number_unsigned()) return corrupt("{}: shape {} has a non-integer or negative dimension", where(), j["shape"].dump());
    const uint64_t v = d.get<uint64_t>();
    if (v > (uint64_t{1} << 62)) return corrupt("{}: dimension {} is too large", where(), v);
    e.shape.push_back(static_cast<int64_t>(v));
  }
  const auto& off = j["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
    return corrupt("{}: 'data_offsets' must be two non-negative integers, got {}", where(), off.dump());
  }
  const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
  if (begin > end || end > data_bytes) {
    return corrupt("{}: data_offsets [{}, {}] lie outside the data section of {} bytes", where(), begin, end, data_bytes);
  }
  uint64_t numel = 0;
  if (!internal::checked_numel(e.shape, &numel)) return corrupt("{}: shape overflows", where());
  uint64_t want = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_info(e.dtype).block_bytes), &want)) {
    return corrupt("{}: byte size overflows", where());
  }
  if (want != end - begin) {
    return corrupt("{}: shape {} of {} needs {} bytes but data_offsets span {}", where(), shape_string(e.shape),
                   safetensors_dtype_name(e.dtype).value_or("?"), want, end - begin);
  }
  e.offset = data_start + begin;
  e.size = end - begin;
  return e;
}

// Where the data section starts (8 + the header length), read ahead of MappedFile::open so a
// kRead copy puts it on a cache line; 0 when the file is too short (parse reports that).
uint64_t data_section_start(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return 0;
  uint8_t len[8];
  const bool ok = std::fread(len, 1, 8, f) == 8;
  std::fclose(f);
  return ok ? 8 + read_u64_le(len) : 0;
}

}  // namespace

Result<DType> safetensors_dtype(std::string_view name) {
  for (const auto& d : kDTypeNames) {
    if (name == d.name) return d.dtype;
  }
  return unimplemented("unknown safetensors dtype '{}'", name);
}

Result<std::string_view> safetensors_dtype_name(DType dtype) {
  for (const auto& d : kDTypeNames) {
    if (d.dtype == dtype) return std::string_view(d.name);
  }
  return unimplemented("dtype {} cannot be stored in safetensors", dtype_name(dtype));
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  auto map = TRY(MappedFile::open(path, default_load_mode(), data_section_start(path)));
  const uint8_t* data = map->data();
  const size_t size = map->size();
  auto file = TRY(parse(data, size, path));
  file->map_ = std::move(map);
  return file;
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::parse(const uint8_t* data, size_t size, std::string path) {
  if (size < 8) return corrupt("{}: {} bytes is too short for a safetensors header", path, size);
  const uint64_t n = read_u64_le(data);
  if (n > kMaxHeaderBytes) return corrupt("{}: header length {} exceeds the limit of {}", path, n, kMaxHeaderBytes);
  if (n > size - 8) return corrupt("{}: header length {} runs past the end of the {}-byte file", path, n, size);
  if (n < 2) return corrupt("{}: header length {} is too short for a JSON object", path, n);
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->data_ = data;
  f->size_ = size;
  f->path_ = std::move(path);
  f->header_bytes_ = 8 + n;
  const std::string_view text(reinterpret_cast<const char*>(data + 8), n);
  nlohmann::json header = TRY(internal::parse_json_strict(text, f->path_));
  if (!header.is_object()) return corrupt("{}: header is not a JSON object", f->path_);
  const uint64_t data_bytes = size - 8 - n;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) return corrupt("{}: __metadata__ is not an object", f->path_);
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) return corrupt("{}: __metadata__ value '{}' is not a string", f->path_, m.key());
        f->metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    TensorEntry e = TRY(parse_entry(f->path_, it.key(), it.value(), data_bytes, 8 + n));
    f->tensors_.push_back(std::move(e));
  }
  // No two tensors may share bytes.
  std::vector<const TensorEntry*> by_offset;
  for (const auto& t : f->tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorEntry* prev = by_offset[i - 1];
    if (by_offset[i]->offset < prev->offset + prev->size) {
      return corrupt("{}: tensors '{}' and '{}' overlap", f->path_, prev->name, by_offset[i]->name);
    }
  }
  std::sort(f->tensors_.begin(), f->tensors_.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
  for (size_t i = 0; i < f->tensors_.size(); ++i) f->index_.emplace(f->tensors_[i].name, i);
  return f;
}

const TensorEntry* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Tensor SafetensorsFile::view(const TensorEntry& e) const {
  return Tensor::contiguous(e.dtype, e.shape, const_cast<uint8_t*>(data_ + e.offset));
}

Result<SafetensorsWriter> SafetensorsWriter::create(const std::string& path, std::vector<TensorSpec> specs,
                                                    const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<uint64_t> sizes;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& s : specs) {
    if (!names.insert(s.name).second) return invalid_argument("{}: duplicate tensor name '{}'", path, s.name);
    const std::string_view dname = TRY(safetensors_dtype_name(s.dtype));
    uint64_t numel = 0;
    if (!internal::checked_numel(s.shape, &numel)) return invalid_argument("{}: bad shape for '{}'", path, s.name);
    const uint64_t bytes = dtype_bytes(s.dtype, numel);
    header[s.name] = {{"dtype", dname}, {"shape", s.shape}, {"data_offsets", {offset, offset + bytes}}};
    sizes.push_back(bytes);
    offset += bytes;
  }
  std::string text = header.dump();
  // The data section on a cache line (the format pads the header with spaces; the reference
  // writer pads to 8): tensors whose offsets are multiples of 64 are then cache-line aligned when
  // mapped, which the FP8 kernels read a few percent faster (base/mmap.h).
  while ((8 + text.size()) % kCacheLine != 0) text.push_back(' ');
  OutputFile file = TRY(OutputFile::create(path));
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  TRY(file.write(len, 8));
  TRY(file.write(text));
  return SafetensorsWriter(std::move(file), std::move(specs), std::move(sizes));
}

Status SafetensorsWriter::append(const void* data, size_t bytes) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    while (current_ < sizes_.size() && written_in_current_ == sizes_[current_]) {
      ++current_;
      written_in_current_ = 0;
    }
    if (current_ >= sizes_.size()) return invalid_argument("{}: more data than the declared tensors hold", file_.path());
    const uint64_t n = std::min<uint64_t>(bytes, sizes_[current_] - written_in_current_);
    TRY(file_.write(p, n));
    p += n;
    bytes -= n;
    written_in_current_ += n;
    total_ += n;
  }
  return {};
}

Status SafetensorsWriter::finish() {
  while (current_ < sizes_.size() && written_in_current_ == sizes_[current_]) {
    ++current_;
    written_in_current_ = 0;
  }
  if (current_ != sizes_.size()) {
    return failed_precondition("{}: tensor '{}' is incomplete ({} of {} bytes written)", file_.path(),
                               specs_[current_].name, written_in_current_, sizes_[current_]);
  }
  return file_.close();
}

Result<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::open(const std::string& path) {
  namespace fs = std::filesystem;
  auto ck = std::make_unique<SafetensorsCheckpoint>();
  std::vector<std::string> shard_paths;
  std::map<std::string, std::string> weight_map;
  if (is_directory(path)) {
    const std::string index = (fs::path(path) / "model.safetensors.index.json").string();
    if (path_exists(index)) {
      const std::string text = TRY(read_file(index));
      nlohmann::json j = TRY(internal::parse_json_strict(text, index));
      if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
        return corrupt("{}: no 'weight_map' object", index);
      }
      std::set<std::string> shards;
      for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
        if (!it.value().is_string()) return corrupt("{}: weight_map['{}'] is not a string", index, it.key());
        const std::string shard = it.value().get<std::string>();
        if (shard.find('/') != std::string::npos || shard == "..") {
          return corrupt("{}: shard name '{}' must be a file in the same directory", index, shard);
        }
        weight_map[it.key()] = shard;
        shards.insert(shard);
      }
      for (const auto& s : shards) shard_paths.push_back((fs::path(path) / s).string());
    } else {
      std::vector<std::string> found;
      for (const auto& entry : fs::directory_iterator(path)) {
        if (entry.path().extension() == ".safetensors") found.push_back(entry.path().string());
      }
      if (found.empty()) return not_found("{}: no model.safetensors.index.json and no .safetensors files", path);
      std::sort(found.begin(), found.end());
      shard_paths = found;
    }
  } else {
    shard_paths.push_back(path);
  }
  for (const auto& sp : shard_paths) ck->files_.push_back(TRY(SafetensorsFile::open(sp)));
  // Mapped files leave the tensors where the file puts them: say so when most start mid line.
  uint64_t misaligned = 0, total = 0;
  for (const auto& f : ck->files_) {
    const MappedFile* m = f->mapping();
    if (m == nullptr || m->mode() != LoadMode::kMap) continue;
    const auto base = reinterpret_cast<uintptr_t>(m->data());
    for (const auto& e : f->tensors()) {
      total += e.size;
      if ((base + e.offset) % kCacheLine != 0) misaligned += e.size;
    }
  }
  if (misaligned * 2 > total) {
    log_info(
        "{}: {:.0f}% of the tensor bytes start mid cache line in the mapped files (safetensors pads its "
        "header to 8 bytes); --no-mmap reads them aligned, which the FP8 kernels read a few percent faster",
        path, 100.0 * static_cast<double>(misaligned) / static_cast<double>(total));
  }
  for (const auto& f : ck->files_) {
    const std::string fname = fs::path(f->path()).filename().string();
    for (const auto& e : f->tensors()) {
      if (ck->index_.count(e.name)) {
        return corrupt("tensor '{}' appears in two shards ({} and {})", e.name,
                       ck->all_[ck->index_.find(e.name)->second].file->path(), f->path());
      }
      if (!weight_map.empty()) {
        auto it = weight_map.find(e.name);
        if (it == weight_map.end()) {
          return corrupt("{}: tensor '{}' is not listed in model.safetensors.index.json", f->path(), e.name);
        }
        if (it->second != fname) {
          return corrupt("tensor '{}' is in {} but the index says {}", e.name, fname, it->second);
        }
      }
      ck->index_.emplace(e.name, ck->all_.size());
      ck->all_.push_back(Located{f.get(), &e});
    }
  }
  for (const auto& [name, shard] : weight_map) {
    if (!ck->index_.count(name)) return corrupt("index lists tensor '{}' in {} but that shard lacks it", name, shard);
  }
  return ck;
}

const SafetensorsCheckpoint::Located* SafetensorsCheckpoint::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &all_[it->second];
}

uint64_t SafetensorsCheckpoint::total_bytes() const {
  uint64_t n = 0;
  for (const auto& t : all_) n += t.entry->size;
  return n;
}

Status write_safetensors_index(const std::string& dir, const std::map<std::string, std::string>& weight_map,
                               uint64_t total_size) {
  nlohmann::ordered_json j;
  j["metadata"] = {{"total_size", total_size}};
  j["weight_map"] = weight_map;
  return write_file_atomic((std::filesystem::path(dir) / "model.safetensors.index.json").string(), j.dump(2) + "\n");
}

}  // namespace fathom
