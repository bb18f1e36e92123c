// libFuzzer target: arbitrary bytes as a safetensors file; every tensor view must lie inside.
#include <cstdint>
#include <cstdlib>

#include "formats/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = fathom::SafetensorsFile::parse(data, size, "fuzz.safetensors");
  if (!f.ok()) return 0;
  for (const auto& t : (*f)->tensors()) {
    if (t.offset + t.size > size) std::abort();
    fathom::Tensor v = (*f)->view(t);
    volatile uint8_t sink = 0;
    if (t.size > 0) sink = static_cast<const uint8_t*>(v.data)[t.size - 1];
    (void)sink;
  }
  return 0;
}
