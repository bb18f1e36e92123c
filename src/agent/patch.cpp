// Unified diff parsing and application. See patch.h.
#include "agent/patch.h"

#include <cstdlib>

#include "base/strings.h"

namespace fathom::agent {
namespace {

std::string strip_path(std::string_view p) {
  p = trim(p);
  if (auto tab = p.find('\t'); tab != std::string_view::npos) p = p.substr(0, tab);
  if (p == "/dev/null") return "";
  if (starts_with(p, "a/") || starts_with(p, "b/")) p.remove_prefix(2);
  return std::string(p);
}

std::vector<std::string> split_lines(const std::string& text, bool* trailing_newline) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos) {
      lines.push_back(text.substr(start));
      *trailing_newline = false;
      return lines;
    }
    lines.push_back(text.substr(start, nl - start));
    start = nl + 1;
  }
  *trailing_newline = true;
  return lines;
}

}  // namespace

Result<std::vector<FilePatch>> parse_unified_diff(const std::string& text) {
  std::vector<FilePatch> files;
  bool trailing;
  std::vector<std::string> lines = split_lines(text, &trailing);
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    if (starts_with(l, "--- ") && i + 1 < lines.size() && starts_with(lines[i + 1], "+++ ")) {
      files.push_back(
          FilePatch{.old_path = strip_path(l.substr(4)), .new_path = strip_path(lines[i + 1].substr(4))});
      ++i;
      continue;
    }
    if (starts_with(l, "@@")) {
      if (files.empty())
        return invalid_argument("patch line {}: hunk before any '--- '/'+++ ' file header", i + 1);
      Hunk h{.header = l};
      int64_t old_n = 1, new_n = 1;
      const char* p = l.c_str() + 2;
      while (*p == ' ') ++p;
      if (*p != '-') return invalid_argument("patch line {}: malformed hunk header '{}'", i + 1, l);
      h.old_start = std::strtoll(p + 1, const_cast<char**>(&p), 10);
      if (*p == ',') old_n = std::strtoll(p + 1, const_cast<char**>(&p), 10);
      while (*p == ' ') ++p;
      if (*p != '+') return invalid_argument("patch line {}: malformed hunk header '{}'", i + 1, l);
      std::strtoll(p + 1, const_cast<char**>(&p), 10);
      if (*p == ',') new_n = std::strtoll(p + 1, const_cast<char**>(&p), 10);
      int64_t seen_old = 0, seen_new = 0;
      while (i + 1 < lines.size() && (seen_old < old_n || seen_new < new_n)) {
        const std::string& b = lines[i + 1];
        if (starts_with(b, "\\")) {  // "\ No newline at end of file"
          ++i;
          continue;
        }
        const char c = b.empty() ? ' ' : b[0];  // an empty line is an empty context line
        if (c != ' ' && c != '-' && c != '+') break;
        h.lines.push_back(b.empty() ? " " : b);
        if (c != '+') ++seen_old;
        if (c != '-') ++seen_new;
        ++i;
      }
      if (seen_old != old_n || seen_new != new_n)
        return invalid_argument(
            "patch: hunk '{}' of {} has {} old and {} new lines, its header says {} and {}", l,
            files.back().new_path.empty() ? files.back().old_path : files.back().new_path, seen_old, seen_new,
            old_n, new_n);
      files.back().hunks.push_back(std::move(h));
    }
  }
  if (files.empty())
    return invalid_argument(
        "patch: no '--- a/FILE' / '+++ b/FILE' header found (a unified diff is expected)");
  for (const auto& f : files)
    if (f.hunks.empty() && !f.new_path.empty())
      return invalid_argument("patch: file {} has no hunks", f.new_path);
  return files;
}

Result<std::string> apply_hunks(const std::string& original, const FilePatch& patch) {
  bool trailing = true;
  std::vector<std::string> lines =
      original.empty() ? std::vector<std::string>{} : split_lines(original, &trailing);
  const std::string name = patch.new_path.empty() ? patch.old_path : patch.new_path;
  int64_t offset = 0;  // how far earlier hunks moved the text
  for (size_t hi = 0; hi < patch.hunks.size(); ++hi) {
    const Hunk& h = patch.hunks[hi];
    std::vector<std::string> before, after;
    for (const auto& l : h.lines) {
      if (l[0] != '+') before.push_back(l.substr(1));
      if (l[0] != '-') after.push_back(l.substr(1));
    }
    auto matches_at = [&](int64_t pos) {
      if (pos < 0 || pos + static_cast<int64_t>(before.size()) > static_cast<int64_t>(lines.size()))
        return false;
      for (size_t k = 0; k < before.size(); ++k)
        if (lines[static_cast<size_t>(pos) + k] != before[k]) return false;
      return true;
    };
    const int64_t want = std::max<int64_t>(0, (before.empty() ? h.old_start : h.old_start - 1) + offset);
    int64_t found = -1;
    if (matches_at(want)) {
      found = want;
    } else {
      int64_t best_dist = -1;
      bool tie = false;
      for (int64_t pos = 0; pos + static_cast<int64_t>(before.size()) <= static_cast<int64_t>(lines.size());
           ++pos) {
        if (!matches_at(pos)) continue;
        const int64_t d = std::abs(pos - want);
        if (best_dist < 0 || d < best_dist)
          found = pos, best_dist = d, tie = false;
        else if (d == best_dist)
          tie = true;
      }
      if (found >= 0 && tie)
        return invalid_argument("{}: hunk {} ({}) matches two places equally near line {}; add context", name,
                                hi + 1, h.header, h.old_start);
    }
    if (found < 0)
      return invalid_argument(
          "{}: hunk {} ({}) does not apply: its context and removed lines are not in the file", name, hi + 1,
          h.header);
    lines.erase(lines.begin() + found, lines.begin() + found + static_cast<int64_t>(before.size()));
    lines.insert(lines.begin() + found, after.begin(), after.end());
    offset += static_cast<int64_t>(after.size()) - static_cast<int64_t>(before.size());
  }
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    out += lines[i];
    if (i + 1 < lines.size() || trailing) out += "\n";
  }
  return out;
}

}  // namespace fathom::agent
