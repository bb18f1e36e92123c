// GGUF: round trips with every metadata type, version 2 files, and malformed files.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>

#include "base/fs.h"
#include "base/rng.h"
#include "formats/gguf.h"
#include "formats/model_config.h"
#include "tensor/convert.h"

namespace fathom {
namespace {

std::string temp_path(const std::string& name) {
  const std::string dir = testing::TempDir() + "/formats_gguf";
  std::filesystem::create_directories(dir);
  return dir + "/" + name;
}

// A little-endian byte builder for hand-made files.
struct Bytes {
  std::string s;
  template <typename T>
  Bytes& put(T v) {
    s.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Bytes& str(std::string_view v) {
    put<uint64_t>(v.size());
    s.append(v);
    return *this;
  }
};

Status parse_bytes(const std::string& s) {
  return GgufFile::parse(reinterpret_cast<const uint8_t*>(s.data()), s.size(), "t.gguf").status();
}

TEST(Gguf, RoundTripsEveryValueTypeAndTensorData) {
  GgufValue nested;
  nested.type = GgufType::kArray;
  nested.elem_type = GgufType::kArray;
  nested.arr = {GgufValue::i32_array({1, 2}), GgufValue::i32_array({-3})};
  GgufValue u8;
  u8.type = GgufType::kU8;
  u8.u = 200;
  GgufValue i16;
  i16.type = GgufType::kI16;
  i16.i = -300;
  GgufValue f64;
  f64.type = GgufType::kF64;
  f64.f = 0.1;
  GgufValue i64;
  i64.type = GgufType::kI64;
  i64.i = -(int64_t{1} << 40);
  std::vector<std::pair<std::string, GgufValue>> meta = {
      {"general.architecture", GgufValue::string("deepseek2")},
      {"a.u8", u8}, {"a.i16", i16}, {"a.u32", GgufValue::u32(7)}, {"a.i32", GgufValue::i32(-7)},
      {"a.u64", GgufValue::u64(uint64_t{1} << 50)}, {"a.i64", i64}, {"a.f32", GgufValue::f32(1.5f)},
      {"a.f64", f64}, {"a.bool", GgufValue::boolean(true)}, {"a.strs", GgufValue::string_array({"x", "", "ζ"})},
      {"a.nested", nested}};
  Rng rng(2);
  std::vector<float> w(64 * 3);
  for (auto& v : w) v = static_cast<float>(rng.normal());
  std::vector<BlockQ8_0> q(2 * 3);
  quantize_row_q8_0(w.data(), q.data(), 64 * 3);
  std::vector<uint16_t> h(5);
  for (auto& v : h) v = f32_to_f16(static_cast<float>(rng.normal()));
  const std::string path = temp_path("rt.gguf");
  auto wr = GgufWriter::create(path, meta,
                               {{"w.f32", DType::kF32, {3, 64}}, {"w.q8", DType::kQ8_0, {3, 64}}, {"b.f16", DType::kF16, {5}}});
  ASSERT_TRUE(wr.ok()) << wr.status().to_string();
  ASSERT_TRUE(wr->append(w.data(), w.size() * 4).ok());
  ASSERT_TRUE(wr->append(q.data(), q.size() * sizeof(BlockQ8_0)).ok());
  ASSERT_TRUE(wr->append(h.data(), h.size() * 2).ok());
  ASSERT_TRUE(wr->finish().ok());

  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ((*f)->version(), 3u);
  EXPECT_EQ((*f)->alignment(), 32u);
  EXPECT_EQ(*(*f)->get_string("general.architecture"), "deepseek2");
  EXPECT_EQ((*f)->get("a.u8")->u, 200u);
  EXPECT_EQ((*f)->get("a.i16")->i, -300);
  EXPECT_EQ(*(*f)->get_int("a.u64"), int64_t{1} << 50);
  EXPECT_EQ(*(*f)->get_int("a.i64"), -(int64_t{1} << 40));
  EXPECT_EQ(*(*f)->get_float("a.f32"), 1.5);
  EXPECT_EQ(*(*f)->get_float("a.f64"), 0.1);
  EXPECT_TRUE(*(*f)->get_bool("a.bool"));
  EXPECT_EQ((*f)->get("a.strs")->arr[2].s, "ζ");
  EXPECT_EQ((*f)->get("a.nested")->to_json().dump(), "[[1,2],[-3]]");
  EXPECT_EQ((*f)->get_int("a.strs").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*f)->get_int("nope").status().code(), StatusCode::kNotFound);
  const GgufTensorInfo* tq = (*f)->find("w.q8");
  ASSERT_NE(tq, nullptr);
  EXPECT_EQ(tq->shape, (std::vector<int64_t>{3, 64}));
  EXPECT_EQ(tq->size, 6u * 34);
  EXPECT_EQ(tq->offset % 32, 0u);
  EXPECT_EQ(std::memcmp((*f)->view(*tq).data, q.data(), tq->size), 0);
  EXPECT_EQ(std::memcmp((*f)->view(*(*f)->find("w.f32")).data, w.data(), w.size() * 4), 0);
  EXPECT_EQ(std::memcmp((*f)->view(*(*f)->find("b.f16")).data, h.data(), 10), 0);
  EXPECT_EQ(ggml_type_name(DType::kQ8_0), "Q8_0");
}

// A minimal hand-made file: version, one kv, one tensor.
std::string minimal(uint32_t version, uint32_t value_type, uint32_t ggml_type, uint64_t offset, uint64_t ne0,
                    size_t data_bytes) {
  Bytes b;
  b.put<uint32_t>(0x46554747).put<uint32_t>(version).put<uint64_t>(1).put<uint64_t>(1);
  b.str("k").put<uint32_t>(value_type).put<uint32_t>(5);
  b.str("t").put<uint32_t>(1).put<uint64_t>(ne0).put<uint32_t>(ggml_type).put<uint64_t>(offset);
  while (b.s.size() % 32) b.s.push_back('\0');
  b.s.append(data_bytes, '\x02');
  return b.s;
}

TEST(Gguf, ReadsVersion2AndRejectsMalformedFiles) {
  ASSERT_TRUE(parse_bytes(minimal(2, 4, 0, 0, 4, 16)).ok());
  ASSERT_TRUE(parse_bytes(minimal(3, 4, 8, 0, 32, 34)).ok());
  struct Case {
    std::string bytes;
    std::string needle;
  };
  std::string dup_keys;
  {
    Bytes b;
    b.put<uint32_t>(0x46554747).put<uint32_t>(3).put<uint64_t>(0).put<uint64_t>(2);
    b.str("k").put<uint32_t>(4).put<uint32_t>(1).str("k").put<uint32_t>(4).put<uint32_t>(2);
    dup_keys = b.s;
  }
  std::string deep;
  {
    Bytes b;
    b.put<uint32_t>(0x46554747).put<uint32_t>(3).put<uint64_t>(0).put<uint64_t>(1).str("deep").put<uint32_t>(9);
    for (int i = 0; i < 20; ++i) b.put<uint32_t>(9).put<uint64_t>(1);
    b.put<uint32_t>(4).put<uint64_t>(1).put<uint32_t>(0);
    deep = b.s;
  }
  std::string huge_array;
  {
    Bytes b;
    b.put<uint32_t>(0x46554747).put<uint32_t>(3).put<uint64_t>(0).put<uint64_t>(1).str("a");
    b.put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(uint64_t{1} << 60);
    huge_array = b.s;
  }
  std::string bad_align;
  {
    Bytes b;
    b.put<uint32_t>(0x46554747).put<uint32_t>(3).put<uint64_t>(0).put<uint64_t>(1);
    b.str("general.alignment").put<uint32_t>(4).put<uint32_t>(48);
    bad_align = b.s;
  }
  std::vector<Case> cases = {
      {"GGU", "truncated"},
      {std::string("XXXX\3\0\0\0", 8), "not a GGUF file"},
      {minimal(1, 4, 0, 0, 4, 16), "version 1 is obsolete"},
      {minimal(9, 4, 0, 0, 4, 16), "unsupported GGUF version 9"},
      {minimal(3, 13, 0, 0, 4, 16), "unknown GGUF value type 13"},
      {minimal(3, 4, 37, 0, 4, 16), "unknown ggml tensor type 37"},
      {minimal(3, 4, 0, 8, 4, 16), "not a multiple of the alignment"},
      {minimal(3, 4, 0, 0, 4, 8), "runs past the end"},
      {minimal(3, 4, 8, 0, 33, 68), "whole number of Q8_0 blocks"},
      {dup_keys, "duplicate metadata key 'k'"},
      {deep, "nests arrays deeper"},
      {huge_array, "claims"},
      {bad_align, "power of two"},
  };
  for (const auto& c : cases) {
    Status st = parse_bytes(c.bytes);
    EXPECT_FALSE(st.ok()) << c.needle;
    EXPECT_NE(st.message().find(c.needle), std::string::npos) << st.message() << " (wanted: " << c.needle << ")";
  }
  const std::string good = minimal(3, 4, 0, 0, 4, 16);
  for (size_t n = 0; n < good.size(); ++n) EXPECT_FALSE(parse_bytes(good.substr(0, n)).ok()) << n;
}

TEST(Gguf, WriterRejectsBadTensors) {
  EXPECT_FALSE(GgufWriter::create(temp_path("b1.gguf"), {}, {{"x", DType::kQ8_0, {2, 33}}}).ok());
  EXPECT_FALSE(GgufWriter::create(temp_path("b2.gguf"), {}, {{"x", DType::kF8E4M3, {2, 32}}}).ok());
  EXPECT_FALSE(GgufWriter::create(temp_path("b3.gguf"), {}, {{"x", DType::kF32, {1}}, {"x", DType::kF32, {1}}}).ok());
  EXPECT_FALSE(GgufWriter::create(temp_path("b4.gguf"), {}, {{"x", DType::kF32, {1, 1, 1, 1, 1}}}).ok());
}

TEST(Gguf, ModelMetadataRoundTripsThroughTheConfig) {
  ModelConfig c;
  c.model_type = "deepseek_v3";
  c.vocab_size = 1000;
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.moe_intermediate_size = 128;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 8;
  c.n_routed_experts = 16;
  c.n_shared_experts = 1;
  c.num_experts_per_tok = 4;
  c.n_group = 4;
  c.topk_group = 2;
  c.first_k_dense_replace = 1;
  c.q_lora_rank = 128;
  c.kv_lora_rank = 64;
  c.qk_nope_head_dim = 32;
  c.qk_rope_head_dim = 32;
  c.v_head_dim = 32;
  c.scoring_func = ScoringFunc::kSigmoid;
  c.topk_method = TopkMethod::kNoauxTc;
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5;
  c.rope_scaling = {true, 40.0, 4096, 32.0, 1.0, 1.0, 1.0};
  c.num_nextn_predict_layers = 1;
  ASSERT_TRUE(c.validate().ok()) << c.validate().to_string();
  const std::string path = temp_path("cfg.gguf");
  auto w = GgufWriter::create(path, gguf_model_metadata(c, "tiny"), {});
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(w->finish().ok());
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  auto back = model_config_from_gguf(**f);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->hidden_size, 256);
  EXPECT_EQ(back->qk_nope_head_dim, 32);
  EXPECT_EQ(back->v_head_dim, 32);
  EXPECT_EQ(back->q_lora_rank, 128);
  EXPECT_EQ(back->n_group, 4);
  EXPECT_EQ(back->topk_method, TopkMethod::kNoauxTc);
  EXPECT_TRUE(back->norm_topk_prob);
  EXPECT_NEAR(back->rope_scaling.mscale_all_dim, 1.0, 1e-6);
  EXPECT_NEAR(back->softmax_scale(), c.softmax_scale(), 1e-6);
  EXPECT_EQ(back->num_nextn_predict_layers, 1);
  EXPECT_EQ(back->param_counts().total, c.param_counts().total);
}

}  // namespace
}  // namespace fathom
