// printable_id: chunk ids are arbitrary bytes (KV ids carry a binary 32-byte hash), so messages
// show them with the leading printable part as is and the rest in hex: "K<0x12ab...>".
// Internal to storage/.
#pragma once

#include <string>
#include <string_view>

#include <fmt/format.h>

namespace fathom::storage {

inline std::string printable_id(std::string_view id) {
  size_t plain = 0;
  while (plain < id.size() && id[plain] >= 0x20 && id[plain] < 0x7f) ++plain;
  if (plain == id.size()) return std::string(id);
  std::string out(id.substr(0, plain));
  out += "<0x";
  for (size_t i = plain; i < id.size(); ++i) out += fmt::format("{:02x}", static_cast<unsigned char>(id[i]));
  out += ">";
  return out;
}

}  // namespace fathom::storage
