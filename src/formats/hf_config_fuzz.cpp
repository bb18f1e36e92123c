// libFuzzer target: arbitrary bytes as config.json; a config that validates must have sane
// derived numbers.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "formats/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto c = fathom::parse_hf_config(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.json");
  if (!c.ok()) return 0;
  if (c->hidden_size <= 0 || c->kv_lora_rank <= 0) std::abort();
  (void)c->param_counts();
  (void)c->softmax_scale();
  return 0;
}
