// Trainer checkpoints (format in docs/train.md): one file, written to a temporary name, fsynced
// and renamed, so a crash leaves the previous checkpoint intact. Everything is verified (size,
// XXH3 trailer, magic, version, config, tensor table) before anything is filled in.
#include <xxhash.h>

#include <cstring>
#include <filesystem>

#include "base/fs.h"
#include "formats/model_config.h"
#include "train/trainer.h"

namespace fathom::train {
namespace {

constexpr char kMagic[8] = {'F', 'T', 'H', 'M', 'C', 'K', 'P', 'T'};
constexpr uint32_t kVersion = 1;
constexpr size_t kFixed = 8 + 4 + 4 + 8;  // magic, version, reserved, header length

void put_u64(std::string& s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
}
uint64_t get_u64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}

nlohmann::json tensor_table(const ParamLayout& layout) {
  nlohmann::json t = nlohmann::json::array();
  for (const ParamInfo& p : layout.params) t.push_back({p.name, p.offset, p.size});
  return t;
}

// The first key whose value differs, for the error message.
std::string first_difference(const nlohmann::json& a, const nlohmann::json& b) {
  for (auto it = a.begin(); it != a.end(); ++it) {
    if (!b.contains(it.key())) return fmt::format("'{}' (missing in the checkpoint)", it.key());
    if (b[it.key()] != it.value()) {
      return fmt::format("'{}': checkpoint has {}, this run has {}", it.key(), b[it.key()].dump(),
                         it.value().dump());
    }
  }
  for (auto it = b.begin(); it != b.end(); ++it) {
    if (!a.contains(it.key())) return fmt::format("'{}' (only in the checkpoint)", it.key());
  }
  return "?";
}

}  // namespace

Status save_checkpoint(const std::string& path, const CheckpointState& st, const ParamLayout& layout,
                       std::span<const float> params, const AdamW& adam) {
  nlohmann::json h = {{"step", st.step},
                      {"epoch", st.epoch},
                      {"cursor", st.cursor},
                      {"tokens", st.tokens},
                      {"elapsed_s", st.elapsed_s},
                      {"data_hash", fmt::format("{:016x}", st.data_hash)},
                      {"adam_t", adam.t()},
                      {"mtp", layout.mtp},
                      {"total", layout.total},
                      {"config", hf_config_json(layout.config)},
                      {"tensors", tensor_table(layout)},
                      {"run", st.run}};
  const std::string header = h.dump();
  const size_t n = static_cast<size_t>(layout.total) * 4;
  std::string buf;
  buf.reserve(kFixed + header.size() + 3 * n + 8);
  buf.append(kMagic, 8);
  for (uint32_t v : {kVersion, 0u}) {
    for (int i = 0; i < 4; ++i) buf.push_back(static_cast<char>(v >> (8 * i)));
  }
  put_u64(buf, header.size());
  buf += header;
  buf.append(reinterpret_cast<const char*>(params.data()), n);
  buf.append(reinterpret_cast<const char*>(adam.m().data()), n);
  buf.append(reinterpret_cast<const char*>(adam.v().data()), n);
  put_u64(buf, XXH3_64bits(buf.data(), buf.size()));
  return write_file_atomic(path, buf);
}

Result<CheckpointState> load_checkpoint(const std::string& path, const ParamLayout& layout,
                                        std::span<float> params, AdamW& adam) {
  if (!path_exists(path)) return not_found("checkpoint {} does not exist (nothing to resume)", path);
  const std::string buf = TRY(read_file(path));
  if (buf.size() < kFixed + 8 || std::memcmp(buf.data(), kMagic, 8) != 0) {
    return corrupt("checkpoint {}: not a Fathom trainer checkpoint (bad magic or too short: {} bytes)", path,
                   buf.size());
  }
  const uint64_t stored = get_u64(buf.data() + buf.size() - 8);
  if (XXH3_64bits(buf.data(), buf.size() - 8) != stored) {
    return corrupt("checkpoint {}: checksum mismatch (truncated or corrupted file)", path);
  }
  const uint32_t version = static_cast<uint32_t>(get_u64(buf.data() + 8) & 0xffffffffu);
  if (version != kVersion)
    return corrupt("checkpoint {}: version {}, this build reads {}", path, version, kVersion);
  const uint64_t header_len = get_u64(buf.data() + 16);
  const uint64_t n = static_cast<uint64_t>(layout.total) * 4;
  if (header_len > buf.size() || kFixed + header_len + 3 * n + 8 != buf.size()) {
    return invalid_argument(
        "checkpoint {}: {} bytes do not fit a model of {} parameters (a different model?)", path, buf.size(),
        layout.total);
  }
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(buf.substr(kFixed, header_len));
  } catch (const std::exception& e) {
    return corrupt("checkpoint {}: header is not JSON: {}", path, e.what());
  }
  if (!h.is_object() || !h.contains("config") || !h.contains("tensors") || !h.contains("step")) {
    return corrupt("checkpoint {}: header lacks config / tensors / step", path);
  }
  const nlohmann::json cfg = hf_config_json(layout.config);
  if (h["config"] != cfg) {
    return invalid_argument("checkpoint {} was written for a different model config: {}", path,
                            first_difference(cfg, h["config"]));
  }
  if (h.value("mtp", false) != layout.mtp) {
    return invalid_argument("checkpoint {}: MTP module {} in the checkpoint, {} in this run (--mtp)", path,
                            h.value("mtp", false) ? "present" : "absent", layout.mtp ? "on" : "off");
  }
  if (h["tensors"] != tensor_table(layout)) {
    return invalid_argument("checkpoint {}: tensor table differs from this model's layout", path);
  }
  CheckpointState st;
  try {
    st.step = h.at("step").get<int64_t>();
    st.epoch = h.at("epoch").get<int64_t>();
    st.cursor = h.at("cursor").get<int64_t>();
    st.tokens = h.at("tokens").get<int64_t>();
    st.elapsed_s = h.at("elapsed_s").get<double>();
    st.data_hash = std::stoull(h.at("data_hash").get<std::string>(), nullptr, 16);
    st.run = h.value("run", nlohmann::json::object());
    adam.set_t(h.at("adam_t").get<int64_t>());
  } catch (const std::exception& e) {
    return corrupt("checkpoint {}: bad header field: {}", path, e.what());
  }
  const char* p = buf.data() + kFixed + header_len;
  std::memcpy(params.data(), p, n);
  std::memcpy(adam.m().data(), p + n, n);
  std::memcpy(adam.v().data(), p + 2 * n, n);
  return st;
}

}  // namespace fathom::train
