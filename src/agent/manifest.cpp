// Plugin manifests: TOML or JSON files in the plugins directory, and `--plugin` command lines.
#include <toml++/toml.h>

#include <climits>
#include <cstdlib>

#include "agent/plugin_host.h"
#include "agent/process.h"
#include "agent/toml_json.h"
#include "base/fs.h"
#include "base/strings.h"

namespace fathom::agent {
namespace {

using json = nlohmann::json;

std::string substitute(std::string s, const std::map<std::string, std::string>& vars) {
  for (const auto& [k, v] : vars)
    for (size_t p; (p = s.find("${" + k + "}")) != std::string::npos;) s.replace(p, k.size() + 3, v);
  return s;
}

bool valid_plugin_name(const std::string& n) {
  if (n.empty() || n.size() > 32 || n.find("__") != std::string::npos) return false;
  for (char c : n)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') return false;
  return true;
}

Status check_decision(const std::string& d, const std::string& where) {
  if (d == "allow" || d == "ask" || d == "deny") return {};
  return invalid_argument("{}: '{}' is not one of allow, ask, deny", where, d);
}

Result<std::vector<std::string>> shell_split(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  bool in_word = false;
  char quote = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (quote) {
      if (c == quote)
        quote = 0;
      else if (c == '\\' && quote == '"' && i + 1 < s.size())
        cur += s[++i];
      else
        cur += c;
    } else if (c == '\'' || c == '"') {
      quote = c, in_word = true;
    } else if (c == '\\' && i + 1 < s.size()) {
      cur += s[++i], in_word = true;
    } else if (std::isspace(static_cast<unsigned char>(c))) {
      if (in_word) out.push_back(cur), cur.clear(), in_word = false;
    } else {
      cur += c, in_word = true;
    }
  }
  if (quote) return invalid_argument("unterminated {} quote in '{}'", quote, s);
  if (in_word) out.push_back(cur);
  return out;
}

// Directories a command needs to read: its binary and, for scripts, the enclosing node_modules.
void add_install_paths(PluginManifest& m) {
  auto add = [&](const std::string& p) {
    for (const auto& have : m.sandbox.read_only)
      if (have == p) return;
    m.sandbox.read_only.push_back(p);
  };
  std::vector<std::string> candidates = {
      find_in_path(m.command, std::getenv("PATH") ? std::getenv("PATH") : "")};
  candidates.insert(candidates.end(), m.args.begin(), m.args.end());
  for (const auto& c : candidates) {
    if (c.empty() || c[0] != '/' || !path_exists(c) || starts_with(c, "/usr/") || starts_with(c, "/bin/"))
      continue;
    if (starts_with(c, m.sandbox.workspace + "/")) continue;
    char buf[PATH_MAX];
    if (!::realpath(c.c_str(), buf)) continue;
    std::string real = buf;
    if (auto nm = real.rfind("/node_modules/"); nm != std::string::npos)
      add(real.substr(0, nm + 13));
    else
      add(is_directory(real) ? real : real);
  }
  if (!m.install_dir.empty()) add(m.install_dir);
}

Result<PluginManifest> from_json(const json& j, const std::string& source, const std::string& dir,
                                 const std::string& workspace) {
  PluginManifest m;
  m.source = source;
  const std::map<std::string, std::string> vars = {
      {"workspace", workspace}, {"manifest_dir", dir}, {"fathom", self_executable()}};
  try {
    static const std::vector<std::string> known = {
        "name",           "command", "args",    "env",         "env_passthrough", "install_dir",
        "tool_timeout_s", "enabled", "sandbox", "permissions", "description"};
    for (const auto& [k, v] : j.items())
      if (std::find(known.begin(), known.end(), k) == known.end())
        return invalid_argument("{}: unknown field '{}' (known: {})", source, k, join(known, ", "));
    m.name = j.value("name", "");
    if (!j.contains("command") || !j["command"].is_string())
      return invalid_argument("{}: 'command' (a string) is required", source);
    m.command = substitute(j["command"], vars);
    if (m.command == "fathom") m.command = self_executable();
    for (const auto& a : j.value("args", json::array()))
      m.args.push_back(substitute(a.get<std::string>(), vars));
    const json env = j.value("env", json::object());  // items() of a temporary would dangle
    for (const auto& [k, v] : env.items()) m.env[k] = substitute(v.get<std::string>(), vars);
    m.env_passthrough = j.value("env_passthrough", std::vector<std::string>{});
    m.install_dir = substitute(j.value("install_dir", ""), vars);
    if (!m.install_dir.empty() && m.install_dir[0] != '/') m.install_dir = dir + "/" + m.install_dir;
    m.tool_timeout_ms = static_cast<int64_t>(j.value("tool_timeout_s", 0.0) * 1000);
    json sb = j.value("sandbox", json::object());
    json limits = json::object();
    for (const char* k : {"cpu_seconds", "open_files", "pids_max"})
      if (sb.contains(k)) limits[k] = sb[k];
    if (sb.contains("address_space_mb"))
      limits["address_space_bytes"] = sb["address_space_mb"].get<int64_t>() << 20;
    if (sb.contains("file_size_mb")) limits["file_size_bytes"] = sb["file_size_mb"].get<int64_t>() << 20;
    for (const char* k : {"cpu_seconds", "open_files", "pids_max", "address_space_mb", "file_size_mb"})
      sb.erase(k);
    for (const char* k : {"read_only", "read_write"})
      if (sb.contains(k))
        for (auto& p : sb[k]) p = substitute(p.get<std::string>(), vars);
    sb["limits"] = limits;
    sb["workspace"] = workspace;
    m.sandbox = TRY(SandboxProfile::from_json(sb));
    const json perms = j.value("permissions", json::object());
    m.permission_default = perms.value("default", "ask");
    TRY(check_decision(m.permission_default, source + ": permissions.default"));
    const json tools = perms.value("tools", json::object());
    for (const auto& [tool, d] : tools.items()) {
      m.permission_tools[tool] = d.get<std::string>();
      TRY(check_decision(m.permission_tools[tool], source + ": permissions.tools." + tool));
    }
  } catch (const std::exception& e) {
    return invalid_argument("{}: {}", source, e.what());
  }
  return m;
}

std::string default_name(const PluginManifest& m) {
  // fathom mcp X -> X; .../server-filesystem/... -> filesystem; otherwise the command's basename.
  for (size_t i = 0; i + 1 < m.args.size(); ++i)
    if (m.args[i] == "mcp" && m.command == self_executable()) return m.args[i + 1];
  for (const auto& a : m.args) {
    auto p = a.find("server-");
    if (p == std::string::npos) continue;
    std::string n = a.substr(p + 7);
    n = n.substr(0, n.find_first_of("/@ ."));
    if (!n.empty()) return n;
  }
  std::string base = m.command.substr(m.command.rfind('/') + 1);
  std::string out;
  for (char c : base) out += std::isalnum(static_cast<unsigned char>(c)) || c == '-' ? c : '_';
  return out.substr(0, 32);
}

}  // namespace

json PluginManifest::to_json() const {
  return {{"name", name},
          {"command", command},
          {"args", args},
          {"env", env},
          {"env_passthrough", env_passthrough},
          {"install_dir", install_dir},
          {"tool_timeout_ms", tool_timeout_ms},
          {"sandbox", sandbox.to_json()},
          {"permission_default", permission_default},
          {"permission_tools", permission_tools},
          {"source", source}};
}

Result<PluginManifest> load_manifest(const std::string& path, const std::string& workspace) {
  const std::string text = TRY(read_file(path));
  json j;
  if (ends_with(path, ".toml")) {
    try {
      j = toml_to_json(toml::parse(text, path));
    } catch (const toml::parse_error& e) {
      return invalid_argument("{}: line {}: {}", path, e.source().begin.line, e.description());
    }
  } else {
    j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return invalid_argument("{}: not a JSON object", path);
  }
  const std::string dir = path.substr(0, path.rfind('/') == std::string::npos ? 0 : path.rfind('/'));
  PluginManifest m = TRY(from_json(j, path, dir.empty() ? "." : dir, workspace));
  if (m.name.empty()) {
    std::string base = path.substr(path.rfind('/') + 1);
    m.name = base.substr(0, base.rfind('.'));
  }
  if (!valid_plugin_name(m.name))
    return invalid_argument("{}: plugin name '{}' must be 1-32 of [A-Za-z0-9_-] without '__'", path, m.name);
  if (!j.value("enabled", true)) return failed_precondition("{}: disabled (enabled = false)", path);
  add_install_paths(m);
  return m;
}

Result<PluginManifest> manifest_from_command_line(const std::string& spec, const std::string& workspace) {
  std::string name, rest = spec;
  if (auto eq = spec.find('='); eq != std::string::npos && spec.find(' ') > eq) {
    name = spec.substr(0, eq);
    rest = spec.substr(eq + 1);
  }
  std::vector<std::string> words = TRY(shell_split(rest));
  if (words.empty()) return invalid_argument("--plugin '{}': no command", spec);
  json j = {{"command", words[0]},
            {"args", std::vector<std::string>(words.begin() + 1, words.end())},
            {"permissions", {{"default", "allow"}}}};
  PluginManifest m = TRY(from_json(j, "--plugin", ".", workspace));
  if (m.command == self_executable() && m.args.size() >= 2 && m.args[0] == "mcp" &&
      std::find(m.args.begin(), m.args.end(), "--workspace") == m.args.end()) {
    m.args.push_back("--workspace");
    m.args.push_back(workspace);
  }
  m.name = name.empty() ? default_name(m) : name;
  if (!valid_plugin_name(m.name))
    return invalid_argument(
        "--plugin '{}': plugin name '{}' must be 1-32 of [A-Za-z0-9_-] without '__' (use NAME=CMD)", spec,
        m.name);
  add_install_paths(m);
  return m;
}

json toml_to_json(const toml::node& n) {
  if (auto* t = n.as_table()) {
    json j = json::object();
    for (auto& [k, v] : *t) j[std::string(k.str())] = toml_to_json(v);
    return j;
  }
  if (auto* a = n.as_array()) {
    json j = json::array();
    for (auto& v : *a) j.push_back(toml_to_json(v));
    return j;
  }
  // By node type: value<T>() would convert a boolean to an integer.
  if (n.is_string()) return *n.value<std::string>();
  if (n.is_boolean()) return *n.value<bool>();
  if (n.is_integer()) return *n.value<int64_t>();
  if (n.is_floating_point()) return *n.value<double>();
  return nullptr;
}

}  // namespace fathom::agent
