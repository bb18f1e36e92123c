// libFuzzer target: arbitrary bytes as a GGUF file, then the config mapping on whatever parses.
#include <cstdint>
#include <cstdlib>

#include "formats/gguf.h"
#include "formats/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = fathom::GgufFile::parse(data, size, "fuzz.gguf");
  if (!f.ok()) return 0;
  for (const auto& t : (*f)->tensors()) {
    if (t.offset + t.size > size) std::abort();
    volatile uint8_t sink = 0;
    if (t.size > 0) sink = data[t.offset + t.size - 1];
    (void)sink;
  }
  (void)fathom::model_config_from_gguf(**f);
  return 0;
}
