// safetensors: round trips, sharded checkpoints, and every malformed-header case.
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "base/fs.h"
#include "base/rng.h"
#include "formats/safetensors.h"

namespace fathom {
namespace {

std::string temp_path(const std::string& name) {
  const std::string dir = testing::TempDir() + "/formats_st";
  std::filesystem::create_directories(dir);
  return dir + "/" + name;
}

// A file image with the given JSON header and `data_bytes` of data.
std::string image(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  out += header;
  out.append(data_bytes, '\x01');
  return out;
}

Status parse_image(const std::string& img) {
  auto r = SafetensorsFile::parse(reinterpret_cast<const uint8_t*>(img.data()), img.size(), "t.safetensors");
  return r.status();
}

TEST(Safetensors, WritesAndReadsBackEveryTensor) {
  const std::string path = temp_path("roundtrip.safetensors");
  Rng rng(11);
  std::vector<float> a(6 * 5);
  for (auto& v : a) v = static_cast<float>(rng.normal());
  std::vector<uint16_t> b(7);
  for (auto& v : b) v = static_cast<uint16_t>(rng.next_u64());
  std::vector<uint8_t> c(3);
  auto w = SafetensorsWriter::create(path,
                                     {{"a.weight", DType::kF32, {6, 5}},
                                      {"b", DType::kBF16, {7}},
                                      {"c.fp8", DType::kF8E4M3, {1, 3}},
                                      {"empty", DType::kF32, {0, 4}}},
                                     {{"format", "pt"}});
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  ASSERT_TRUE(w->append(a.data(), 40).ok());  // in pieces
  ASSERT_TRUE(w->append(reinterpret_cast<uint8_t*>(a.data()) + 40, a.size() * 4 - 40).ok());
  ASSERT_TRUE(w->append(b.data(), b.size() * 2).ok());
  ASSERT_TRUE(w->append(c.data(), 3).ok());
  ASSERT_TRUE(w->finish().ok());

  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ((*f)->tensors().size(), 4u);
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  EXPECT_EQ((*f)->header_bytes() % kCacheLine, 0u);  // the data section on a cache line
  const TensorEntry* ea = (*f)->find("a.weight");
  ASSERT_NE(ea, nullptr);
  EXPECT_EQ(ea->shape, (std::vector<int64_t>{6, 5}));
  Tensor va = (*f)->view(*ea);
  EXPECT_EQ(std::memcmp(va.data, a.data(), a.size() * 4), 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(va.data) % kCacheLine, 0u);
  const TensorEntry* eb = (*f)->find("b");
  EXPECT_EQ(std::memcmp((*f)->view(*eb).data, b.data(), 14), 0);
  EXPECT_EQ((*f)->find("c.fp8")->dtype, DType::kF8E4M3);
  EXPECT_EQ((*f)->find("missing"), nullptr);
}

// A checkpoint as the reference writer pads it (header to 8 bytes), here with the data section at
// 56 mod 64: mapped, its tensors start mid cache line; --no-mmap (kRead) puts them on one, and
// both read the same values.
TEST(Safetensors, ReadModeAlignsTheDataSectionOfAnyHeader) {
  Rng rng(std::random_device{}());
  std::vector<uint8_t> w(2 * 64 + 64);  // two 64-byte rows and one more
  for (auto& v : w) v = static_cast<uint8_t>(rng.next_u64());
  std::string header = R"({"w":{"dtype":"U8","shape":[3,64],"data_offsets":[0,192]}})";
  while ((8 + header.size()) % 64 != 56) header.push_back(' ');
  std::string img = image(header, 0);
  img.append(reinterpret_cast<const char*>(w.data()), w.size());
  const std::string path = temp_path("mid-line.safetensors");
  ASSERT_TRUE(write_file_atomic(path, img).ok());
  for (LoadMode mode : {LoadMode::kMap, LoadMode::kRead}) {
    set_default_load_mode(mode);
    auto ck = SafetensorsCheckpoint::open(path);
    set_default_load_mode(LoadMode::kMap);
    ASSERT_TRUE(ck.ok()) << ck.status().to_string();
    const auto* t = (*ck)->find("w");
    ASSERT_NE(t, nullptr);
    const Tensor v = (*ck)->view(*t);
    EXPECT_EQ(std::memcmp(v.data, w.data(), w.size()), 0);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % kCacheLine, mode == LoadMode::kMap ? 56u : 0u);
  }
}

TEST(Safetensors, WriterRejectsIncompleteAndExcessData) {
  auto w = SafetensorsWriter::create(temp_path("short.safetensors"), {{"x", DType::kF32, {4}}});
  ASSERT_TRUE(w.ok());
  float v[4] = {1, 2, 3, 4};
  ASSERT_TRUE(w->append(v, 8).ok());
  EXPECT_EQ(w->finish().code(), StatusCode::kFailedPrecondition);
  auto w2 = SafetensorsWriter::create(temp_path("long.safetensors"), {{"x", DType::kF32, {1}}});
  ASSERT_TRUE(w2.ok());
  EXPECT_FALSE(w2->append(v, 8).ok());
  EXPECT_FALSE(SafetensorsWriter::create(temp_path("dup.safetensors"), {{"x", DType::kF32, {1}}, {"x", DType::kF32, {1}}}).ok());
  EXPECT_FALSE(SafetensorsWriter::create(temp_path("q.safetensors"), {{"x", DType::kQ8_0, {32}}}).ok());
}

TEST(Safetensors, RejectsMalformedHeadersWithNamedErrors) {
  struct Case {
    std::string img;
    std::string needle;
  };
  const std::string good = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::vector<Case> cases = {
      {"", "too short"},
      {std::string("\xe8\x03\x00\x00\x00\x00\x00\x00", 8), "runs past the end"},
      {std::string("\x00\x00\x00\x00\x00\x01\x00\x00", 8) + "{}", "exceeds the limit"},
      {image("{\"t\":", 0), "malformed JSON"},
      {image("[1,2]", 0), "not a JSON object"},
      {image(R"({"t":{"dtype":"F13","shape":[2],"data_offsets":[0,8]}})", 8), "unknown safetensors dtype 'F13'"},
      {image(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", 8), "outside the data section"},
      {image(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "needs 12 bytes"},
      {image(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), "negative dimension"},
      {image(R"({"t":{"dtype":"F32","shape":[2]}})", 8), "missing 'data_offsets'"},
      {image(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), "outside the data section"},
      {image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
       "overlap"},
      {image(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8),
       "duplicate key 't'"},
      {image(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}})", 8), "overflows"},
      {image(R"({"__metadata__":{"a":1}})", 0), "not a string"},
  };
  ASSERT_TRUE(parse_image(image(good, 8)).ok());
  for (const auto& c : cases) {
    Status st = parse_image(c.img);
    EXPECT_FALSE(st.ok()) << c.needle;
    EXPECT_NE(st.message().find(c.needle), std::string::npos) << st.message() << " (wanted: " << c.needle << ")";
    EXPECT_NE(st.message().find("t.safetensors"), std::string::npos) << st.message();
  }
}

TEST(Safetensors, TruncatingAValidFileAtEveryLengthNeverCrashes) {
  const std::string full = image(R"({"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},"__metadata__":{"k":"v"}})", 8);
  for (size_t n = 0; n < full.size(); ++n) EXPECT_FALSE(parse_image(full.substr(0, n)).ok()) << n;
}

TEST(SafetensorsCheckpoint, OpensShardsThroughTheIndex) {
  const std::string dir = temp_path("sharded");
  std::filesystem::create_directories(dir);
  float x[2] = {1, 2};
  for (int s = 0; s < 2; ++s) {
    auto w = SafetensorsWriter::create(dir + fmt::format("/model-0000{}-of-00002.safetensors", s + 1),
                                       {{fmt::format("w{}", s), DType::kF32, {2}}});
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(w->append(x, 8).ok());
    ASSERT_TRUE(w->finish().ok());
  }
  ASSERT_TRUE(write_safetensors_index(dir, {{"w0", "model-00001-of-00002.safetensors"},
                                            {"w1", "model-00002-of-00002.safetensors"}}, 16).ok());
  auto ck = SafetensorsCheckpoint::open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_EQ((*ck)->tensors().size(), 2u);
  ASSERT_NE((*ck)->find("w1"), nullptr);
  EXPECT_EQ(static_cast<float*>((*ck)->view(*(*ck)->find("w1")).data)[1], 2.0f);
  EXPECT_EQ((*ck)->total_bytes(), 16u);

  // An index naming a tensor the shard lacks, or a shard path escaping the directory.
  ASSERT_TRUE(write_safetensors_index(dir, {{"w0", "model-00001-of-00002.safetensors"},
                                            {"w1", "model-00002-of-00002.safetensors"},
                                            {"w2", "model-00002-of-00002.safetensors"}}, 16).ok());
  auto bad = SafetensorsCheckpoint::open(dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'w2'"), std::string::npos) << bad.status().message();
  ASSERT_TRUE(write_safetensors_index(dir, {{"w0", "../x.safetensors"}}, 16).ok());
  EXPECT_FALSE(SafetensorsCheckpoint::open(dir).ok());
}

TEST(Safetensors, OpeningASparse16GBFileReadsOnlyTheHeader) {
  // The O(header) claim: a 16 GiB file whose data section is a hole opens instantly and without
  // reading the data (a full read of a hole would take seconds and is what we rule out).
  const std::string path = temp_path("sparse.safetensors");
  const uint64_t bytes = uint64_t{16} << 30;
  {
    const std::string hdr = fmt::format(R"({{"big":{{"dtype":"U8","shape":[{}],"data_offsets":[0,{}]}}}})", bytes, bytes);
    std::string head = image(hdr, 0);
    auto out = OutputFile::create(path);
    ASSERT_TRUE(out.ok());
    ASSERT_TRUE(out->write(head).ok());
    ASSERT_TRUE(out->pwrite_at("\0", 1, head.size() + bytes - 1).ok());
    ASSERT_TRUE(out->close().ok());
  }
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ((*f)->find("big")->size, bytes);
  // Count the data pages resident in memory: opening must not have touched them.
  const MappedFile* m = (*f)->mapping();
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident((m->size() + page - 1) / page);
  ASSERT_EQ(mincore(const_cast<uint8_t*>(m->data()), m->size(), resident.data()), 0);
  size_t n_resident = 0;
  for (unsigned char r : resident) n_resident += r & 1;
  EXPECT_LE(n_resident, 4u) << "pages of the data section were read while opening";
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace fathom
