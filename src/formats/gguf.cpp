// GGUF reader and writer.
#include "formats/gguf.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <set>
#include <unordered_set>

#include "formats/json_util.h"

namespace fathom {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr int kMaxNesting = 8;
constexpr uint32_t kMaxDimsGguf = 4;

struct GgmlTypeRow {
  uint32_t id;
  DType dtype;
  const char* name;
};
constexpr GgmlTypeRow kGgmlTypes[] = {
    {0, DType::kF32, "F32"},         {1, DType::kF16, "F16"},         {2, DType::kQ4_0, "Q4_0"},
    {3, DType::kQ4_1, "Q4_1"},       {6, DType::kQ5_0, "Q5_0"},       {7, DType::kQ5_1, "Q5_1"},
    {8, DType::kQ8_0, "Q8_0"},       {9, DType::kQ8_1, "Q8_1"},       {10, DType::kQ2_K, "Q2_K"},
    {11, DType::kQ3_K, "Q3_K"},      {12, DType::kQ4_K, "Q4_K"},      {13, DType::kQ5_K, "Q5_K"},
    {14, DType::kQ6_K, "Q6_K"},      {15, DType::kQ8_K, "Q8_K"},      {16, DType::kIQ2_XXS, "IQ2_XXS"},
    {17, DType::kIQ2_XS, "IQ2_XS"},  {18, DType::kIQ3_XXS, "IQ3_XXS"}, {19, DType::kIQ1_S, "IQ1_S"},
    {20, DType::kIQ4_NL, "IQ4_NL"},  {21, DType::kIQ3_S, "IQ3_S"},    {22, DType::kIQ2_S, "IQ2_S"},
    {23, DType::kIQ4_XS, "IQ4_XS"},  {24, DType::kI8, "I8"},          {25, DType::kI16, "I16"},
    {26, DType::kI32, "I32"},        {27, DType::kI64, "I64"},        {28, DType::kF64, "F64"},
    {29, DType::kIQ1_M, "IQ1_M"},    {30, DType::kBF16, "BF16"},      {34, DType::kTQ1_0, "TQ1_0"},
    {35, DType::kTQ2_0, "TQ2_0"},    {39, DType::kMXFP4, "MXFP4"},
};

// A bounds-checked little-endian reader over the file image.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, const std::string& path) : data_(data), size_(size), path_(path) {}
  size_t pos() const { return pos_; }
  size_t left() const { return size_ - pos_; }

  template <typename T>
  Result<T> read(std::string_view what) {
    if (left() < sizeof(T)) return corrupt("{}: truncated reading {} at offset {}", path_, what, pos_);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  Result<std::string> read_string(std::string_view what) {
    const uint64_t n = TRY(read<uint64_t>(what));
    if (n > left()) return corrupt("{}: {} has length {} but only {} bytes remain", path_, what, n, left());
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& path_;
};

size_t min_value_bytes(GgufType t) {
  switch (t) {
    case GgufType::kU8: case GgufType::kI8: case GgufType::kBool: return 1;
    case GgufType::kU16: case GgufType::kI16: return 2;
    case GgufType::kU32: case GgufType::kI32: case GgufType::kF32: return 4;
    case GgufType::kU64: case GgufType::kI64: case GgufType::kF64: case GgufType::kString: return 8;
    case GgufType::kArray: return 12;
  }
  return 1;
}

Result<GgufType> read_type(Cursor& c, std::string_view what, const std::string& path) {
  const uint32_t t = TRY(c.read<uint32_t>(what));
  if (t > 12) return corrupt("{}: {} has unknown GGUF value type {}", path, what, t);
  return static_cast<GgufType>(t);
}

Result<GgufValue> read_value(Cursor& c, GgufType type, const std::string& key, const std::string& path, int depth) {
  GgufValue v;
  v.type = type;
  switch (type) {
    case GgufType::kU8: v.u = TRY(c.read<uint8_t>(key)); break;
    case GgufType::kI8: v.i = TRY(c.read<int8_t>(key)); break;
    case GgufType::kU16: v.u = TRY(c.read<uint16_t>(key)); break;
    case GgufType::kI16: v.i = TRY(c.read<int16_t>(key)); break;
    case GgufType::kU32: v.u = TRY(c.read<uint32_t>(key)); break;
    case GgufType::kI32: v.i = TRY(c.read<int32_t>(key)); break;
    case GgufType::kU64: v.u = TRY(c.read<uint64_t>(key)); break;
    case GgufType::kI64: v.i = TRY(c.read<int64_t>(key)); break;
    case GgufType::kF32: v.f = TRY(c.read<float>(key)); break;
    case GgufType::kF64: v.f = TRY(c.read<double>(key)); break;
    case GgufType::kBool: {
      const uint8_t b = TRY(c.read<uint8_t>(key));
      if (b > 1) return corrupt("{}: key '{}' is a bool with value {}", path, key, b);
      v.b = b != 0;
      break;
    }
    case GgufType::kString: v.s = TRY(c.read_string(key)); break;
    case GgufType::kArray: {
      if (depth >= kMaxNesting) return corrupt("{}: key '{}' nests arrays deeper than {}", path, key, kMaxNesting);
      v.elem_type = TRY(read_type(c, key, path));
      const uint64_t n = TRY(c.read<uint64_t>(key));
      if (n > c.left() / min_value_bytes(v.elem_type)) {
        return corrupt("{}: key '{}' claims {} array items but only {} bytes remain", path, key, n, c.left());
      }
      v.arr.reserve(n);
      for (uint64_t k = 0; k < n; ++k) v.arr.push_back(TRY(read_value(c, v.elem_type, key, path, depth + 1)));
      break;
    }
  }
  return v;
}

void write_value(std::string& out, const GgufValue& v, bool with_type);

template <typename T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

void put_string(std::string& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  out.append(s);
}

void write_value(std::string& out, const GgufValue& v, bool with_type) {
  if (with_type) put<uint32_t>(out, static_cast<uint32_t>(v.type));
  switch (v.type) {
    case GgufType::kU8: put<uint8_t>(out, static_cast<uint8_t>(v.u)); break;
    case GgufType::kI8: put<int8_t>(out, static_cast<int8_t>(v.i)); break;
    case GgufType::kU16: put<uint16_t>(out, static_cast<uint16_t>(v.u)); break;
    case GgufType::kI16: put<int16_t>(out, static_cast<int16_t>(v.i)); break;
    case GgufType::kU32: put<uint32_t>(out, static_cast<uint32_t>(v.u)); break;
    case GgufType::kI32: put<int32_t>(out, static_cast<int32_t>(v.i)); break;
    case GgufType::kU64: put<uint64_t>(out, v.u); break;
    case GgufType::kI64: put<int64_t>(out, v.i); break;
    case GgufType::kF32: put<float>(out, static_cast<float>(v.f)); break;
    case GgufType::kF64: put<double>(out, v.f); break;
    case GgufType::kBool: put<uint8_t>(out, v.b ? 1 : 0); break;
    case GgufType::kString: put_string(out, v.s); break;
    case GgufType::kArray:
      put<uint32_t>(out, static_cast<uint32_t>(v.elem_type));
      put<uint64_t>(out, v.arr.size());
      for (const auto& e : v.arr) write_value(out, e, false);
      break;
  }
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

std::string_view gguf_type_name(GgufType t) {
  static constexpr std::string_view kNames[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                                "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(t);
  return i < 13 ? kNames[i] : "?";
}

GgufValue GgufValue::u32(uint32_t v) { GgufValue x; x.type = GgufType::kU32; x.u = v; return x; }
GgufValue GgufValue::i32(int32_t v) { GgufValue x; x.type = GgufType::kI32; x.i = v; return x; }
GgufValue GgufValue::u64(uint64_t v) { GgufValue x; x.type = GgufType::kU64; x.u = v; return x; }
GgufValue GgufValue::f32(float v) { GgufValue x; x.type = GgufType::kF32; x.f = v; return x; }
GgufValue GgufValue::boolean(bool v) { GgufValue x; x.type = GgufType::kBool; x.b = v; return x; }
GgufValue GgufValue::string(std::string v) { GgufValue x; x.type = GgufType::kString; x.s = std::move(v); return x; }
GgufValue GgufValue::string_array(const std::vector<std::string>& v) {
  GgufValue x;
  x.type = GgufType::kArray;
  x.elem_type = GgufType::kString;
  x.arr.reserve(v.size());
  for (const auto& s : v) x.arr.push_back(string(s));
  return x;
}
GgufValue GgufValue::i32_array(const std::vector<int32_t>& v) {
  GgufValue x;
  x.type = GgufType::kArray;
  x.elem_type = GgufType::kI32;
  for (int32_t e : v) x.arr.push_back(i32(e));
  return x;
}
GgufValue GgufValue::f32_array(const std::vector<float>& v) {
  GgufValue x;
  x.type = GgufType::kArray;
  x.elem_type = GgufType::kF32;
  for (float e : v) x.arr.push_back(f32(e));
  return x;
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::kU8: case GgufType::kI8: case GgufType::kU16: case GgufType::kI16:
    case GgufType::kU32: case GgufType::kI32: case GgufType::kU64: case GgufType::kI64: return true;
    default: return false;
  }
}

nlohmann::json GgufValue::to_json(size_t max_array_items) const {
  switch (type) {
    case GgufType::kU8: case GgufType::kU16: case GgufType::kU32: case GgufType::kU64: return u;
    case GgufType::kI8: case GgufType::kI16: case GgufType::kI32: case GgufType::kI64: return i;
    case GgufType::kF32: case GgufType::kF64: return f;
    case GgufType::kBool: return b;
    case GgufType::kString: return s;
    case GgufType::kArray: {
      if (arr.size() > max_array_items) {
        return nlohmann::json{{"type", fmt::format("array[{}]", gguf_type_name(elem_type))}, {"length", arr.size()}};
      }
      nlohmann::json a = nlohmann::json::array();
      for (const auto& e : arr) a.push_back(e.to_json(max_array_items));
      return a;
    }
  }
  return nullptr;
}

Result<DType> ggml_type_to_dtype(uint32_t ggml_type) {
  for (const auto& r : kGgmlTypes) {
    if (r.id == ggml_type) return r.dtype;
  }
  return unimplemented("unknown ggml tensor type {}", ggml_type);
}

Result<uint32_t> dtype_to_ggml_type(DType dtype) {
  for (const auto& r : kGgmlTypes) {
    if (r.dtype == dtype) return r.id;
  }
  return unimplemented("dtype {} has no GGUF tensor type", dtype_name(dtype));
}

std::string ggml_type_name(DType dtype) {
  for (const auto& r : kGgmlTypes) {
    if (r.dtype == dtype) return r.name;
  }
  return std::string(dtype_name(dtype));
}

Result<std::unique_ptr<GgufFile>> GgufFile::open(const std::string& path) {
  auto map = TRY(MappedFile::open(path));
  auto f = TRY(parse(map->data(), map->size(), path));
  f->map_ = std::move(map);
  return f;
}

Result<std::unique_ptr<GgufFile>> GgufFile::parse(const uint8_t* data, size_t size, std::string path) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->data_ = data;
  f->size_ = size;
  f->path_ = std::move(path);
  const std::string& p = f->path_;
  Cursor c(data, size, p);
  const uint32_t magic = TRY(c.read<uint32_t>("magic"));
  if (magic != kMagic) return corrupt("{}: not a GGUF file (magic 0x{:08x})", p, magic);
  f->version_ = TRY(c.read<uint32_t>("version"));
  if (f->version_ == 1) return unimplemented("{}: GGUF version 1 is obsolete; convert it with a current llama.cpp", p);
  if (f->version_ != 2 && f->version_ != 3) return unimplemented("{}: unsupported GGUF version {}", p, f->version_);
  const uint64_t n_tensors = TRY(c.read<uint64_t>("tensor count"));
  const uint64_t n_kv = TRY(c.read<uint64_t>("metadata count"));
  if (n_kv > c.left() / 12) return corrupt("{}: metadata count {} exceeds what the file can hold", p, n_kv);
  std::unordered_set<std::string> keys;
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = TRY(c.read_string("metadata key"));
    if (!keys.insert(key).second) return corrupt("{}: duplicate metadata key '{}'", p, key);
    const GgufType type = TRY(read_type(c, key, p));
    GgufValue v = TRY(read_value(c, type, key, p, 0));
    f->metadata_.emplace_back(std::move(key), std::move(v));
  }
  if (const GgufValue* a = f->get("general.alignment")) {
    if (!a->is_integer() || a->as_int() <= 0 || a->as_int() > (1 << 30) || (a->as_int() & (a->as_int() - 1)) != 0) {
      return corrupt("{}: general.alignment must be a power of two, got {}", p, a->to_json().dump());
    }
    f->alignment_ = static_cast<uint32_t>(a->as_int());
  }
  if (n_tensors > c.left() / 24) return corrupt("{}: tensor count {} exceeds what the file can hold", p, n_tensors);
  std::unordered_set<std::string> names;
  struct Raw {
    uint64_t rel_offset;
  };
  std::vector<Raw> raw;
  for (uint64_t t = 0; t < n_tensors; ++t) {
    GgufTensorInfo info;
    info.name = TRY(c.read_string("tensor name"));
    if (!names.insert(info.name).second) return corrupt("{}: duplicate tensor name '{}'", p, info.name);
    const uint32_t n_dims = TRY(c.read<uint32_t>("tensor n_dims"));
    if (n_dims == 0 || n_dims > kMaxDimsGguf) {
      return corrupt("{}: tensor '{}' has {} dimensions (1..{} allowed)", p, info.name, n_dims, kMaxDimsGguf);
    }
    std::vector<int64_t> ne;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t v = TRY(c.read<uint64_t>("tensor dimension"));
      if (v > (uint64_t{1} << 62)) return corrupt("{}: tensor '{}' dimension {} is too large", p, info.name, v);
      ne.push_back(static_cast<int64_t>(v));
    }
    const uint32_t type = TRY(c.read<uint32_t>("tensor type"));
    auto dtype = ggml_type_to_dtype(type);
    if (!dtype.ok()) return dtype.status().with_context(fmt::format("{}: tensor '{}'", p, info.name));
    info.dtype = *dtype;
    const uint64_t offset = TRY(c.read<uint64_t>("tensor offset"));
    if (offset % f->alignment_ != 0) {
      return corrupt("{}: tensor '{}' offset {} is not a multiple of the alignment {}", p, info.name, offset, f->alignment_);
    }
    const int block = dtype_info(info.dtype).block_elems;
    if (ne[0] % block != 0) {
      return corrupt("{}: tensor '{}' row of {} values is not a whole number of {} blocks ({})", p, info.name, ne[0],
                     ggml_type_name(info.dtype), block);
    }
    info.shape.assign(ne.rbegin(), ne.rend());
    uint64_t numel = 0;
    if (!internal::checked_numel(info.shape, &numel) || numel > (uint64_t{1} << 56)) {
      return corrupt("{}: tensor '{}' shape overflows", p, info.name);
    }
    info.size = dtype_bytes(info.dtype, numel);
    raw.push_back(Raw{offset});
    f->tensors_.push_back(std::move(info));
  }
  f->data_offset_ = align_up(c.pos(), f->alignment_);
  if (f->data_offset_ > size && !f->tensors_.empty()) return corrupt("{}: data section starts past the end of the file", p);
  for (size_t t = 0; t < f->tensors_.size(); ++t) {
    GgufTensorInfo& info = f->tensors_[t];
    info.offset = f->data_offset_ + raw[t].rel_offset;
    if (info.offset < raw[t].rel_offset || info.offset > size || info.size > size - info.offset) {
      return corrupt("{}: tensor '{}' ({} bytes at offset {}) runs past the end of the {}-byte file", p, info.name,
                     info.size, info.offset, size);
    }
  }
  std::vector<const GgufTensorInfo*> sorted;
  for (const auto& t : f->tensors_) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i]->offset < sorted[i - 1]->offset + sorted[i - 1]->size) {
      return corrupt("{}: tensors '{}' and '{}' overlap", p, sorted[i - 1]->name, sorted[i]->name);
    }
  }
  return f;
}

const GgufValue* GgufFile::get(std::string_view key) const {
  for (const auto& [k, v] : metadata_) {
    if (k == key) return &v;
  }
  return nullptr;
}

Result<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = get(key);
  if (v == nullptr) return not_found("{}: metadata key '{}' is missing", path_, key);
  if (!v->is_integer()) return invalid_argument("{}: key '{}' is {}, expected an integer", path_, key, gguf_type_name(v->type));
  return v->as_int();
}

Result<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = get(key);
  if (v == nullptr) return not_found("{}: metadata key '{}' is missing", path_, key);
  if (v->is_float()) return v->f;
  if (v->is_integer()) return static_cast<double>(v->as_int());
  return invalid_argument("{}: key '{}' is {}, expected a number", path_, key, gguf_type_name(v->type));
}

Result<std::string> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = get(key);
  if (v == nullptr) return not_found("{}: metadata key '{}' is missing", path_, key);
  if (v->type != GgufType::kString) return invalid_argument("{}: key '{}' is {}, expected a string", path_, key, gguf_type_name(v->type));
  return v->s;
}

Result<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = get(key);
  if (v == nullptr) return not_found("{}: metadata key '{}' is missing", path_, key);
  if (v->type != GgufType::kBool) return invalid_argument("{}: key '{}' is {}, expected a bool", path_, key, gguf_type_name(v->type));
  return v->b;
}

const GgufTensorInfo* GgufFile::find(std::string_view name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Tensor GgufFile::view(const GgufTensorInfo& t) const {
  return Tensor::contiguous(t.dtype, t.shape, const_cast<uint8_t*>(data_ + t.offset));
}

Result<GgufWriter> GgufWriter::create(const std::string& path, const std::vector<std::pair<std::string, GgufValue>>& metadata,
                                      const std::vector<TensorSpec>& tensors, uint32_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) return invalid_argument("alignment {} is not a power of two", alignment);
  std::string header;
  put<uint32_t>(header, kMagic);
  put<uint32_t>(header, 3);
  put<uint64_t>(header, tensors.size());
  bool has_alignment = false;
  std::set<std::string> keys;
  for (const auto& [k, v] : metadata) {
    if (!keys.insert(k).second) return invalid_argument("{}: duplicate metadata key '{}'", path, k);
    if (k == "general.alignment") has_alignment = true;
  }
  put<uint64_t>(header, metadata.size() + (has_alignment || alignment == 32 ? 0 : 1));
  for (const auto& [k, v] : metadata) {
    put_string(header, k);
    write_value(header, v, true);
  }
  if (!has_alignment && alignment != 32) {
    put_string(header, "general.alignment");
    write_value(header, GgufValue::u32(alignment), true);
  }
  std::vector<uint64_t> sizes;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (!names.insert(t.name).second) return invalid_argument("{}: duplicate tensor name '{}'", path, t.name);
    if (t.shape.empty() || t.shape.size() > kMaxDimsGguf) return invalid_argument("{}: tensor '{}' rank must be 1..4", path, t.name);
    const uint32_t type = TRY(dtype_to_ggml_type(t.dtype));
    TRY(check_block_multiple(t.dtype, static_cast<uint64_t>(t.shape.back()), t.name));
    put_string(header, t.name);
    put<uint32_t>(header, static_cast<uint32_t>(t.shape.size()));
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) put<uint64_t>(header, static_cast<uint64_t>(*it));
    put<uint32_t>(header, type);
    put<uint64_t>(header, offset);
    uint64_t numel = 0;
    if (!internal::checked_numel(t.shape, &numel)) return invalid_argument("{}: bad shape for '{}'", path, t.name);
    const uint64_t bytes = dtype_bytes(t.dtype, numel);
    sizes.push_back(bytes);
    offset = align_up(offset + bytes, alignment);
  }
  header.resize(align_up(header.size(), alignment), '\0');
  OutputFile file = TRY(OutputFile::create(path));
  TRY(file.write(header));
  GgufWriter w(std::move(file), std::move(sizes), alignment);
  TRY(w.advance());
  return w;
}

Status GgufWriter::advance() {
  // Skip tensors already complete (and empty ones), padding after each.
  while (current_ < sizes_.size() && written_in_current_ == sizes_[current_]) {
    const uint64_t pad = align_up(sizes_[current_], alignment_) - sizes_[current_];
    if (pad > 0 && current_ + 1 < sizes_.size()) {
      const std::string zeros(pad, '\0');
      TRY(file_.write(zeros));
    }
    ++current_;
    written_in_current_ = 0;
  }
  return {};
}

Status GgufWriter::append(const void* data, size_t bytes) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    if (current_ >= sizes_.size()) return invalid_argument("{}: more data than the declared tensors hold", file_.path());
    const uint64_t n = std::min<uint64_t>(bytes, sizes_[current_] - written_in_current_);
    TRY(file_.write(p, n));
    p += n;
    bytes -= n;
    written_in_current_ += n;
    TRY(advance());
  }
  return {};
}

Status GgufWriter::finish() {
  TRY(advance());
  if (current_ != sizes_.size()) return failed_precondition("{}: tensor {} is incomplete", file_.path(), current_);
  return file_.close();
}

}  // namespace fathom
