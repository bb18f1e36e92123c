// A JSON Schema subset for tool arguments: type (one or a list), properties, required,
// additionalProperties (false or a schema), items, enum, const, minimum/maximum,
// minLength/maxLength, minItems/maxItems, anyOf/oneOf (first match). Enough to catch what a model
// gets wrong (missing or misspelt fields, wrong types) before a tool runs. Unknown keywords are
// ignored, as JSON Schema says. Internal to the agent component.
#pragma once

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace fathom::agent {

// Error: "arguments.path: expected integer, got string \"3\"".
Status validate_json(const nlohmann::json& schema, const nlohmann::json& value,
                     const std::string& where = "arguments");

}  // namespace fathom::agent
