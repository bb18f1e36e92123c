// Unified diffs for the files plugin's apply_patch: parse (several files, /dev/null for created
// and deleted files, `a/` `b/` prefixes stripped) and apply each hunk by exact match of its context
// and removed lines, at the stated line first, else at the nearest unique position. A hunk that
// matches nowhere, or several places equally near, is an error naming the file and hunk.
// Internal to the agent component.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace fathom::agent {

struct Hunk {
  int64_t old_start = 0;           // 1-based, as in "@@ -old_start,n +..."
  std::string header;              // the @@ line
  std::vector<std::string> lines;  // each starting with ' ', '-' or '+'
};

struct FilePatch {
  std::string old_path, new_path;  // "" for /dev/null
  std::vector<Hunk> hunks;
};

Result<std::vector<FilePatch>> parse_unified_diff(const std::string& text);
// Applies one file's hunks to its text; returns the new text.
Result<std::string> apply_hunks(const std::string& original, const FilePatch& patch);

}  // namespace fathom::agent
