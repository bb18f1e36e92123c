// `fathom mcp files`: read (line ranges), write, list, search, edit by exact search/replace, and
// apply unified diffs, all confined to the workspace (workspace_fs.h). Does not follow symlinks
// out of the workspace, does not read binary files into search results.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <dirent.h>
#include <fcntl.h>
#include <pcre2.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <functional>

#include "agent/builtins.h"
#include "agent/patch.h"
#include "agent/workspace_fs.h"
#include "base/strings.h"

namespace fathom::agent {
namespace {

using json = nlohmann::json;

int64_t count_lines(std::string_view s) {
  int64_t n = static_cast<int64_t>(std::count(s.begin(), s.end(), '\n'));
  return (!s.empty() && s.back() != '\n') ? n + 1 : n;
}

int64_t line_of(std::string_view text, size_t offset) {
  return 1 +
         static_cast<int64_t>(std::count(text.begin(), text.begin() + static_cast<int64_t>(offset), '\n'));
}

ToolOutput read_file(const Workspace& ws, const FilesPluginOptions& o, const json& a) {
  const std::string path = a["path"];
  auto text = ws.read(path, o.max_read_bytes * 16);
  if (!text.ok()) return tool_error(text.status().message());
  const int64_t total = count_lines(*text);
  const int64_t first = a.value("start_line", int64_t{1});
  const int64_t last = a.value("end_line", total);
  if (first < 1 || (total > 0 && first > total) || last < first)
    return tool_error(
        fmt::format("line range {}-{} is outside {} (which has {} lines)", first, last, path, total));
  std::string out;
  int64_t line = 1;
  size_t pos = 0;
  while (pos < text->size() && line <= last) {
    size_t nl = text->find('\n', pos);
    size_t end = nl == std::string::npos ? text->size() : nl + 1;
    if (line >= first) out.append(*text, pos, end - pos);
    pos = end;
    ++line;
  }
  if (out.size() > o.max_read_bytes)
    return tool_error(
        fmt::format("lines {}-{} of {} are {} bytes, over the {} byte limit; read a smaller range", first,
                    std::min(last, total), path, out.size(), o.max_read_bytes));
  return ToolOutput{
      .text = fmt::format("{} (lines {}-{} of {})\n{}", path, first, std::min(last, total), total, out)};
}

ToolOutput write_file(const Workspace& ws, const json& a) {
  const std::string path = a["path"], content = a["content"];
  if (Status s = ws.write(path, content); !s.ok()) return tool_error(s.message());
  return ToolOutput{
      .text = fmt::format("wrote {} bytes ({} lines) to {}", content.size(), count_lines(content), path)};
}

Status walk(const Workspace& ws, const std::string& rel, int depth, bool recursive,
            const std::function<bool(const std::string& path, const struct stat& st)>& visit) {
  int fd = TRY(ws.open_at(rel, O_RDONLY | O_DIRECTORY));
  DIR* dir = ::fdopendir(fd);
  if (!dir) {
    ::close(fd);
    return errno_status(errno, "opendir " + rel);
  }
  std::vector<std::pair<std::string, struct stat>> entries;
  while (struct dirent* e = ::readdir(dir)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st;
    if (::fstatat(::dirfd(dir), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    entries.emplace_back(rel == "." ? name : rel + "/" + name, st);
  }
  ::closedir(dir);
  std::sort(entries.begin(), entries.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  for (const auto& [path, st] : entries) {
    if (!visit(path, st)) return {};
    const std::string base = path.substr(path.rfind('/') + 1);
    if (recursive && S_ISDIR(st.st_mode) && depth < 32 && base != ".git" && base != "node_modules")
      TRY(walk(ws, path, depth + 1, recursive, visit));
  }
  return {};
}

ToolOutput list_directory(const Workspace& ws, const json& a) {
  const std::string path = a.value("path", ".");
  const bool recursive = a.value("recursive", false);
  const int64_t max_entries = a.value("max_entries", int64_t{500});
  auto rel = ws.relative(path);
  if (!rel.ok()) return tool_error(rel.status().message());
  std::string out;
  int64_t n = 0;
  bool more = false;
  Status s = walk(ws, *rel, 0, recursive, [&](const std::string& p, const struct stat& st) {
    if (n >= max_entries) return !(more = true);
    ++n;
    if (S_ISDIR(st.st_mode))
      out += p + "/\n";
    else if (S_ISLNK(st.st_mode))
      out += p + " -> (symlink)\n";
    else
      out += fmt::format("{}  ({} bytes)\n", p, st.st_size);
    return true;
  });
  if (!s.ok()) return tool_error(s.message());
  if (more) out += fmt::format("... stopped at {} entries (max_entries)\n", max_entries);
  if (out.empty()) out = "(empty directory)\n";
  return ToolOutput{.text = out};
}

ToolOutput search(const Workspace& ws, const FilesPluginOptions& o, const json& a) {
  const std::string pattern = a["pattern"];
  const bool regex = a.value("regex", false);
  const int64_t max_results = a.value("max_results", int64_t{100});
  auto rel = ws.relative(a.value("path", "."));
  if (!rel.ok()) return tool_error(rel.status().message());
  pcre2_code* re = nullptr;
  if (regex) {
    int err;
    PCRE2_SIZE where;
    re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                       PCRE2_UTF | PCRE2_MATCH_INVALID_UTF, &err, &where, nullptr);
    if (!re) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      return tool_error(fmt::format("invalid regex at offset {}: {}", where, reinterpret_cast<char*>(msg)));
    }
  }
  pcre2_match_data* md = re ? pcre2_match_data_create_from_pattern(re, nullptr) : nullptr;
  std::string out;
  int64_t hits = 0;
  bool more = false;
  auto search_file = [&](const std::string& p) {
    auto text = ws.read(p, o.max_read_bytes * 16);
    if (!text.ok() || text->substr(0, 4096).find('\0') != std::string::npos)
      return true;  // binary or unreadable
    int64_t line = 1;
    for (size_t pos = 0; pos < text->size(); ++line) {
      size_t nl = text->find('\n', pos);
      std::string_view l =
          std::string_view(*text).substr(pos, (nl == std::string::npos ? text->size() : nl) - pos);
      bool hit =
          re ? pcre2_match(re, reinterpret_cast<PCRE2_SPTR>(l.data()), l.size(), 0, 0, md, nullptr) >= 0
             : l.find(pattern) != std::string_view::npos;
      if (hit) {
        if (hits >= max_results) return !(more = true);
        ++hits;
        out += fmt::format("{}:{}: {}\n", p, line,
                           l.size() > 300 ? std::string(l.substr(0, 300)) + "..." : std::string(l));
      }
      if (nl == std::string::npos) break;
      pos = nl + 1;
    }
    return true;
  };
  struct stat st;
  Status s;
  int fd = ws.open_at(*rel, O_PATH).value_or(-1);
  if (fd >= 0 && ::fstat(fd, &st) == 0 && !S_ISDIR(st.st_mode)) {
    search_file(*rel);
  } else {
    s = walk(ws, *rel, 0, true, [&](const std::string& p, const struct stat& e) {
      return S_ISREG(e.st_mode) ? search_file(p) : true;
    });
  }
  if (fd >= 0) ::close(fd);
  if (md) pcre2_match_data_free(md);
  if (re) pcre2_code_free(re);
  if (!s.ok()) return tool_error(s.message());
  if (more) out += fmt::format("... stopped at {} matches (max_results)\n", max_results);
  if (out.empty()) out = "no matches\n";
  return ToolOutput{.text = out};
}

ToolOutput edit_file(const Workspace& ws, const FilesPluginOptions& o, const json& a) {
  const std::string path = a["path"], old_text = a["old_text"], new_text = a["new_text"];
  const bool replace_all = a.value("replace_all", false);
  if (old_text.empty()) return tool_error("old_text is empty; to create or overwrite a file use write_file");
  auto text = ws.read(path, o.max_read_bytes * 16);
  if (!text.ok()) return tool_error(text.status().message());
  std::vector<size_t> at;
  for (size_t p = text->find(old_text); p != std::string::npos; p = text->find(old_text, p + old_text.size()))
    at.push_back(p);
  if (at.empty()) {
    std::string hint;
    const std::string first_line(trim(old_text.substr(0, old_text.find('\n'))));
    if (!first_line.empty())
      if (size_t p = text->find(first_line); p != std::string::npos)
        hint = fmt::format(
            " (its first line, ignoring indentation, appears at line {}: check whitespace and the "
            "following lines)",
            line_of(*text, p));
    return tool_error(fmt::format("old_text was not found in {}{}", path, hint));
  }
  if (at.size() > 1 && !replace_all) {
    std::vector<std::string> lines;
    for (size_t p : at) lines.push_back(std::to_string(line_of(*text, p)));
    return tool_error(
        fmt::format("old_text matches {} places in {} (lines {}); include more surrounding lines to make "
                    "it unique, or set replace_all",
                    at.size(), path, join(lines, ", ")));
  }
  std::string out;
  size_t prev = 0;
  for (size_t p : at) {
    out.append(*text, prev, p - prev);
    out += new_text;
    prev = p + old_text.size();
  }
  out.append(*text, prev, std::string::npos);
  if (Status s = ws.write(path, out); !s.ok()) return tool_error(s.message());
  return ToolOutput{.text = fmt::format("replaced {} occurrence{} in {} (at line {})", at.size(),
                                        at.size() == 1 ? "" : "s", path, line_of(*text, at[0]))};
}

ToolOutput apply_patch(const Workspace& ws, const FilesPluginOptions& o, const json& a) {
  auto files = parse_unified_diff(a["patch"].get<std::string>());
  if (!files.ok()) return tool_error(files.status().message());
  std::vector<std::pair<std::string, std::optional<std::string>>>
      results;  // path -> new text (nullopt: delete)
  for (const auto& f : *files) {
    std::string original;
    if (!f.old_path.empty()) {
      auto text = ws.read(f.old_path, o.max_read_bytes * 16);
      if (!text.ok()) return tool_error(text.status().message());
      original = *text;
    }
    if (f.new_path.empty()) {
      results.emplace_back(f.old_path, std::nullopt);
      continue;
    }
    auto updated = apply_hunks(original, f);
    if (!updated.ok()) return tool_error(updated.status().message() + " (nothing was changed)");
    results.emplace_back(f.new_path, *updated);
  }
  std::string summary;
  for (const auto& [path, text] : results) {  // every hunk applied: now write
    if (!text) {
      auto rel = ws.relative(path);
      if (!rel.ok() || ::unlinkat(ws.fd(), rel->c_str(), 0) != 0)
        return tool_error(fmt::format("could not delete {}", path));
      summary += "deleted " + path + "\n";
      continue;
    }
    if (Status s = ws.write(path, *text); !s.ok()) return tool_error(s.message());
    summary += fmt::format("patched {} ({} lines)\n", path, count_lines(*text));
  }
  return ToolOutput{.text = summary};
}

nlohmann::ordered_json schema(nlohmann::ordered_json props, std::vector<std::string> required) {
  return {{"type", "object"},
          {"properties", std::move(props)},
          {"required", required},
          {"additionalProperties", false}};
}

}  // namespace

Result<std::vector<ServerTool>> files_tools(const FilesPluginOptions& o) {
  auto ws = std::make_shared<Workspace>(TRY(Workspace::open(o.workspace)));
  const json str = {{"type", "string"}};
  const json integer = {{"type", "integer"}, {"minimum", 1}};
  std::vector<ServerTool> tools = {
      {"read_file", "Read a text file in the workspace, optionally a 1-based inclusive line range.",
       schema({{"path", str}, {"start_line", integer}, {"end_line", integer}}, {"path"}),
       [ws, o](const json& a, ToolContext&) { return read_file(*ws, o, a); }},
      {"list_directory",
       "List a directory of the workspace (recursive optional; skips .git and node_modules).",
       schema({{"path", str}, {"recursive", {{"type", "boolean"}}}, {"max_entries", integer}}, {}),
       [ws](const json& a, ToolContext&) { return list_directory(*ws, a); }},
      {"search", "Search text files under a path for a literal string (or a PCRE2 regex with regex=true).",
       schema({{"pattern", str}, {"path", str}, {"regex", {{"type", "boolean"}}}, {"max_results", integer}},
              {"pattern"}),
       [ws, o](const json& a, ToolContext&) { return search(*ws, o, a); }},
  };
  if (o.read_only) return tools;
  tools.push_back({"write_file",
                   "Create or overwrite a file in the workspace (parent directories are created).",
                   schema({{"path", str}, {"content", str}}, {"path", "content"}),
                   [ws](const json& a, ToolContext&) { return write_file(*ws, a); }});
  tools.push_back(
      {"edit_file",
       "Replace old_text with new_text in a file. old_text must match exactly once unless replace_all.",
       schema({{"path", str}, {"old_text", str}, {"new_text", str}, {"replace_all", {{"type", "boolean"}}}},
              {"path", "old_text", "new_text"}),
       [ws, o](const json& a, ToolContext&) { return edit_file(*ws, o, a); }});
  tools.push_back({"apply_patch",
                   "Apply a unified diff (one or more files; all hunks apply or nothing changes).",
                   schema({{"patch", str}}, {"patch"}),
                   [ws, o](const json& a, ToolContext&) { return apply_patch(*ws, o, a); }});
  return tools;
}

}  // namespace fathom::agent
