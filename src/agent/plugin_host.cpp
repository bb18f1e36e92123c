// PluginHost: plugin processes, supervision (restart with backoff), inotify hot-swap and tool
// routing. See plugin_host.h.
#include "agent/plugin_host.h"

#include <dirent.h>
#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

#include "agent/process.h"
#include "base/fs.h"
#include "base/log.h"
#include "base/strings.h"

namespace fathom::agent {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string namespaced_tool_name(const std::string& plugin, const std::string& tool) {
  std::string out = plugin + "__";
  for (char c : tool) out += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ? c : '_';
  if (out.size() > 64)
    out = out.substr(0, 55) + fmt::format("_{:08x}", static_cast<uint32_t>(std::hash<std::string>{}(tool)));
  return out;
}

nlohmann::ordered_json openai_tool_specs(const std::vector<ToolEntry>& tools) {
  constexpr size_t kMaxDescription = 2000;  // bytes, cut at a character boundary (utf8_prefix)
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& t : tools) {
    nlohmann::ordered_json params = t.input_schema.is_object() && !t.input_schema.empty()
                                        ? t.input_schema
                                        : nlohmann::ordered_json{{"type", "object"}};
    out.push_back({{"type", "function"},
                   {"function",
                    {{"name", t.name},
                     {"description", utf8_prefix(t.description, kMaxDescription)},
                     {"parameters", params}}}});
  }
  return out;
}

namespace {

struct Plugin {
  PluginManifest manifest;
  std::shared_ptr<McpClient> client;
  std::vector<McpTool> tools;
  std::string state = "starting";  // starting | running | crashed | failed
  std::string last_error;
  int restarts = 0;
  int failures = 0;  // consecutive
  Clock::time_point next_start{};
  Clock::time_point started_at{};
  bool starting = false;
  std::shared_ptr<std::atomic<bool>> tools_dirty = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace

struct PluginHost::Impl {
  PluginHostOptions options;
  mutable std::mutex mu;
  std::map<std::string, std::shared_ptr<Plugin>> plugins;
  std::map<std::string, PluginManifest> cli_plugins;
  std::map<std::string, std::string> dir_files;  // manifest path -> plugin name
  std::atomic<uint64_t> version{1};
  int inotify_fd = -1;
  std::atomic<bool> stop{false};
  std::thread supervisor;
  Clock::time_point last_scan{};

  void event(const std::string& msg) {
    log_info("{}", msg);
    if (options.on_event) options.on_event(msg);
  }

  std::vector<std::string> plugin_env(const PluginManifest& m) {
    std::vector<std::string> keep = {"PATH", "LANG", "LC_ALL", "TERM", "FATHOM_LOG"};
    keep.insert(keep.end(), m.env_passthrough.begin(), m.env_passthrough.end());
    std::vector<std::string> env = environment_subset(keep);
    env.push_back("HOME=" + options.workspace);
    for (const auto& [k, v] : m.env) env.push_back(k + "=" + v);
    return env;
  }

  // Starts one plugin (spawn, handshake, tools/list) outside the lock.
  void start(const std::shared_ptr<Plugin>& p) {
    PluginManifest m;
    {
      std::lock_guard<std::mutex> lock(mu);
      m = p->manifest;
    }
    SandboxProfile profile = m.sandbox;
    if (profile.mode == "auto" && options.sandbox.mode != "auto") profile.mode = options.sandbox.mode;
    profile.workspace = options.workspace;
    profile.limits.wall_timeout_ms = 0;
    std::vector<std::string> argv = {m.command};
    argv.insert(argv.end(), m.args.begin(), m.args.end());
    argv = sandbox_wrap(profile, argv);
    McpClientOptions co;
    co.name = m.name;
    co.init_timeout_ms = static_cast<int>(options.start_timeout_ms);
    co.roots = {options.workspace};
    std::weak_ptr<std::atomic<bool>> dirty = p->tools_dirty;
    co.on_tools_changed = [dirty] {
      if (auto d = dirty.lock()) d->store(true);
    };
    const std::string name = m.name;
    co.on_stderr = [name](const std::string& line) { log_debug("plugin '{}' stderr: {}", name, line); };
    auto client = McpClient::start(argv, plugin_env(m), options.workspace, co);
    Result<std::vector<McpTool>> tools =
        client.ok() ? (*client)->list_tools(static_cast<int>(options.start_timeout_ms))
                    : Result<std::vector<McpTool>>(client.status());
    std::lock_guard<std::mutex> lock(mu);
    p->starting = false;
    auto it = plugins.find(m.name);
    if (it == plugins.end() || it->second != p) return;  // removed while starting
    if (!tools.ok()) {
      p->last_error = tools.status().message();
      p->state = "failed";
      p->failures++;
      const int64_t backoff = std::min<int64_t>(30000, 250ll << std::min(p->failures - 1, 7));
      p->next_start = Clock::now() + std::chrono::milliseconds(backoff);
      log_warn("plugin '{}' failed to start: {} (retry in {} ms)", m.name, p->last_error, backoff);
      return;
    }
    p->client = std::shared_ptr<McpClient>(std::move(*client));
    p->tools = std::move(*tools);
    p->state = "running";
    p->started_at = Clock::now();
    version++;
    log_info("plugin '{}' running: {} tools, MCP {}", m.name, p->tools.size(), p->client->protocol_version());
  }

  void add(PluginManifest m) {
    auto p = std::make_shared<Plugin>();
    p->manifest = std::move(m);
    const std::string name = p->manifest.name;
    std::shared_ptr<Plugin> old;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (auto it = plugins.find(name); it != plugins.end()) old = it->second;
      plugins[name] = p;
    }
    if (old && old->client)
      old->client->kill(fmt::format("plugin '{}' was replaced (manifest changed)", name));
    version++;
  }

  void remove(const std::string& name, const std::string& why) {
    std::shared_ptr<Plugin> old;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = plugins.find(name);
      if (it == plugins.end()) return;
      old = it->second;
      plugins.erase(it);
    }
    if (old->client) old->client->kill(fmt::format("plugin '{}' was {}", name, why));
    version++;
  }

  // Re-reads the plugins directory: starts new manifests, restarts changed ones, stops removed.
  void scan_dir() {
    if (options.plugins_dir.empty()) return;
    std::set<std::string> seen;
    if (DIR* d = ::opendir(options.plugins_dir.c_str())) {
      while (struct dirent* e = ::readdir(d)) {
        std::string f = e->d_name;
        if (f[0] == '.' || !(ends_with(f, ".toml") || ends_with(f, ".json"))) continue;
        seen.insert(options.plugins_dir + "/" + f);
      }
      ::closedir(d);
    }
    for (const auto& path : seen) {
      auto m = load_manifest(path, options.workspace);
      std::string old_name;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (auto it = dir_files.find(path); it != dir_files.end()) old_name = it->second;
      }
      if (!m.ok()) {
        if (m.status().code() != StatusCode::kFailedPrecondition)
          log_warn("plugins: {}", m.status().message());
        if (!old_name.empty()) {
          remove(old_name, "disabled or its manifest became invalid");
          std::lock_guard<std::mutex> lock(mu);
          dir_files.erase(path);
        }
        continue;
      }
      bool changed = true;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (cli_plugins.count(m->name)) {
          log_warn("plugins: {} names plugin '{}', already given with --plugin; ignored", path, m->name);
          continue;
        }
        auto it = plugins.find(m->name);
        changed = it == plugins.end() || it->second->manifest.to_json() != m->to_json();
        dir_files[path] = m->name;
      }
      if (!old_name.empty() && old_name != m->name) remove(old_name, "renamed");
      if (changed) {
        event(fmt::format("plugins: {} plugin '{}' from {}", old_name.empty() ? "starting" : "restarting",
                          m->name, path));
        add(*m);
      }
    }
    std::vector<std::pair<std::string, std::string>> gone;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (const auto& [path, name] : dir_files)
        if (!seen.count(path)) gone.emplace_back(path, name);
      for (const auto& [path, name] : gone) dir_files.erase(path);
    }
    for (const auto& [path, name] : gone) {
      event(fmt::format("plugins: stopping plugin '{}' ({} removed)", name, path));
      remove(name, "removed");
    }
  }

  void supervise_once() {
    bool rescan = false;
    if (inotify_fd >= 0) {
      char buf[8192];
      while (::read(inotify_fd, buf, sizeof(buf)) > 0) rescan = true;
    }
    if (!options.plugins_dir.empty() && Clock::now() - last_scan > std::chrono::seconds(3)) rescan = true;
    if (rescan) {
      last_scan = Clock::now();
      scan_dir();
    }
    std::vector<std::shared_ptr<Plugin>> to_start, to_refresh;
    {
      std::lock_guard<std::mutex> lock(mu);
      const auto now = Clock::now();
      for (auto& [name, p] : plugins) {
        if (p->starting) continue;
        if (p->state == "running" && p->client && !p->client->alive()) {
          p->state = "crashed";
          p->last_error =
              p->client->stderr_tail().empty() ? "exited" : "exited; stderr: " + p->client->stderr_tail();
          p->failures = now - p->started_at > std::chrono::seconds(60) ? 1 : p->failures + 1;
          const int64_t backoff = std::min<int64_t>(30000, 250ll << std::min(p->failures - 1, 7));
          p->next_start = now + std::chrono::milliseconds(backoff);
          p->client.reset();
          p->tools.clear();
          version++;
          log_warn("plugin '{}' exited; restarting in {} ms", name, backoff);
        }
        if (p->state != "running" && now >= p->next_start) {
          if (p->state != "starting") p->restarts++;
          p->starting = true;
          to_start.push_back(p);
        } else if (p->state == "running" && p->tools_dirty->exchange(false)) {
          to_refresh.push_back(p);
        }
      }
    }
    std::vector<std::thread> threads;
    for (auto& p : to_start) threads.emplace_back([this, p] { start(p); });
    for (auto& t : threads) t.join();
    for (auto& p : to_refresh) {
      auto tools = p->client->list_tools(static_cast<int>(options.start_timeout_ms));
      std::lock_guard<std::mutex> lock(mu);
      if (tools.ok()) {
        p->tools = std::move(*tools);
        version++;
        event(fmt::format("plugin '{}': tool list changed ({} tools)", p->manifest.name, p->tools.size()));
      }
    }
  }
};

PluginHost::PluginHost(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<PluginHost>> PluginHost::create(PluginHostOptions options,
                                                       std::vector<PluginManifest> plugins) {
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  std::set<std::string> names;
  for (auto& m : plugins) {
    if (!names.insert(m.name).second)
      return invalid_argument("two plugins are named '{}'; name one with --plugin NAME=CMD", m.name);
    impl->cli_plugins[m.name] = m;
    impl->add(m);
  }
  if (!impl->options.plugins_dir.empty()) {
    if (!is_directory(impl->options.plugins_dir))
      return not_found("--plugins-dir '{}' is not a directory", impl->options.plugins_dir);
    impl->inotify_fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (impl->inotify_fd >= 0 &&
        ::inotify_add_watch(impl->inotify_fd, impl->options.plugins_dir.c_str(),
                            IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_CREATE) < 0) {
      ::close(impl->inotify_fd);
      impl->inotify_fd = -1;
    }
    if (impl->inotify_fd < 0)
      log_warn("plugins: inotify unavailable; rescanning {} every 3 s", impl->options.plugins_dir);
    impl->scan_dir();
    impl->last_scan = Clock::now();
  }
  impl->supervise_once();  // start everything before the first model call
  Impl* raw = impl.get();
  impl->supervisor = std::thread([raw] {
    while (!raw->stop.load()) {
      if (raw->inotify_fd >= 0) {
        struct pollfd p = {raw->inotify_fd, POLLIN, 0};
        ::poll(&p, 1, 100);
        if (p.revents & POLLIN)
          std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let writers finish
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      if (!raw->stop.load()) raw->supervise_once();
    }
  });
  return std::unique_ptr<PluginHost>(new PluginHost(std::move(impl)));
}

PluginHost::~PluginHost() {
  impl_->stop = true;
  if (impl_->supervisor.joinable()) impl_->supervisor.join();
  std::map<std::string, std::shared_ptr<Plugin>> all;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    all.swap(impl_->plugins);
  }
  std::vector<std::thread> stops;  // plugins take up to a second each to stop: in parallel
  for (auto& [name, p] : all) stops.emplace_back([p] { p->client.reset(); });
  for (auto& t : stops) t.join();
  if (impl_->inotify_fd >= 0) ::close(impl_->inotify_fd);
}

std::vector<ToolEntry> PluginHost::tools() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<ToolEntry> out;
  for (const auto& [name, p] : impl_->plugins) {
    if (p->state != "running" || !p->client || !p->client->alive()) continue;  // crashed: restarting
    for (const auto& t : p->tools) {
      ToolEntry e{.name = namespaced_tool_name(name, t.name),
                  .plugin = name,
                  .tool = t.name,
                  .description = t.description,
                  .input_schema = t.input_schema};
      auto it = p->manifest.permission_tools.find(t.name);
      e.permission = it != p->manifest.permission_tools.end() ? it->second : p->manifest.permission_default;
      out.push_back(std::move(e));
    }
  }
  return out;
}

uint64_t PluginHost::tools_version() const {
  return impl_->version.load();
}

Result<McpToolResult> PluginHost::call(const std::string& namespaced, const json& arguments,
                                       int64_t timeout_ms, const ProgressFn& on_progress,
                                       const std::atomic<bool>* cancel) {
  std::shared_ptr<McpClient> client;
  std::string tool;
  int64_t plugin_timeout = 0;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    for (const auto& [name, p] : impl_->plugins) {
      for (const auto& t : p->tools) {
        if (namespaced_tool_name(name, t.name) != namespaced) continue;
        if (p->state != "running" || !p->client)
          return unavailable("plugin '{}' is {} ({})", name, p->state, p->last_error);
        client = p->client;
        tool = t.name;
        plugin_timeout = p->manifest.tool_timeout_ms;
      }
    }
  }
  if (!client) return not_found("unknown tool '{}'", namespaced);
  const int64_t t =
      plugin_timeout > 0 ? plugin_timeout : (timeout_ms > 0 ? timeout_ms : impl_->options.tool_timeout_ms);
  return client->call_tool(tool, arguments, static_cast<int>(t), on_progress, cancel);
}

std::vector<PluginStatus> PluginHost::status() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<PluginStatus> out;
  for (const auto& [name, p] : impl_->plugins)
    out.push_back({.name = name,
                   .state = p->state,
                   .last_error = p->last_error,
                   .restarts = p->restarts,
                   .n_tools = p->tools.size()});
  return out;
}

void PluginHost::poll_now() {
  impl_->supervise_once();
}

}  // namespace fathom::agent
