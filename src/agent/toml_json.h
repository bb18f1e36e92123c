// TOML -> JSON, so manifests and policies in either format go through one JSON reader
// (defined in manifest.cpp). Internal to agent/.
#pragma once

#include <toml++/toml.h>
#include <nlohmann/json.hpp>

namespace fathom::agent {

nlohmann::json toml_to_json(const toml::node& n);

}  // namespace fathom::agent
