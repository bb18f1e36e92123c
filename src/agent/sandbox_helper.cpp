// The sandbox helper: `fathom agent sandbox [--probe] --profile JSON -- CMD ARGS`. Runs as its
// own single-threaded process (spawned by the agent), so it may clone, write id maps and mount
// freely. Outside: pids cgroup, idmapped workspace, id maps, the wall-clock timeout, cleanup.
// Inside (sandbox_child.cpp): mounts, pivot_root, privilege drop, seccomp, PID 1.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>

#include "agent/sandbox.h"
#include "agent/sandbox_impl.h"
#include "base/fs.h"
#include "base/strings.h"
#include "base/timer.h"

namespace fathom::agent {
namespace {

using json = nlohmann::json;

volatile sig_atomic_t g_child_pid = 0;

void forward_kill(int) {
  if (g_child_pid > 0) ::kill(g_child_pid, SIGKILL);
}

Status write_text(const std::string& path, std::string_view text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return errno_status(errno, "open " + path);
  Status s = write_all(fd, text.data(), text.size(), path);
  ::close(fd);
  return s;
}

// Finds where this process's cgroup for `controller` lives: v1 (a mount with that option) or v2.
struct CgroupDir {
  std::string path;
  int version = 0;
};

Result<CgroupDir> own_cgroup(const std::string& controller) {
  std::string self = TRY(read_file("/proc/self/cgroup"));
  std::string mounts = TRY(read_file("/proc/self/mounts"));
  std::string v1_rel, v2_rel;
  bool have_v2 = false;
  for (auto line : split(self, '\n')) {
    auto parts = split(line, ':');
    if (parts.size() < 3) continue;
    if (parts[0] == "0" && parts[1].empty()) v2_rel = std::string(parts[2]), have_v2 = true;
    for (auto c : split(parts[1], ','))
      if (c == controller) v1_rel = std::string(parts[2]);
  }
  std::string v1_mount, v2_mount;
  for (auto line : split(mounts, '\n')) {
    auto f = split(line, ' ');
    if (f.size() < 4) continue;
    if (f[2] == "cgroup")
      for (auto opt : split(f[3], ','))
        if (opt == controller) v1_mount = std::string(f[1]);
    if (f[2] == "cgroup2" && v2_mount.empty()) v2_mount = std::string(f[1]);
  }
  if (!v1_mount.empty() && !v1_rel.empty()) return CgroupDir{v1_mount + (v1_rel == "/" ? "" : v1_rel), 1};
  if (!v2_mount.empty() && have_v2) return CgroupDir{v2_mount + (v2_rel == "/" ? "" : v2_rel), 2};
  return unavailable("no {} cgroup controller is mounted", controller);
}

// Creates a pids cgroup for the sandbox; returns its directory.
Result<CgroupDir> make_pids_cgroup(int64_t pids_max) {
  CgroupDir base = TRY(own_cgroup("pids"));
  CgroupDir dir{fmt::format("{}/fathom-sandbox-{}", base.path, ::getpid()), base.version};
  if (::mkdir(dir.path.c_str(), 0755) != 0 && errno != EEXIST)
    return errno_status(errno, "mkdir " + dir.path);
  if (!path_exists(dir.path + "/pids.max") && base.version == 2) {
    (void)write_text(base.path + "/cgroup.subtree_control", "+pids");  // may fail: no delegation
  }
  if (!path_exists(dir.path + "/pids.max")) {
    ::rmdir(dir.path.c_str());
    return unavailable("the pids controller is not enabled in {}", base.path);
  }
  Status s = write_text(dir.path + "/pids.max", std::to_string(pids_max));
  if (!s.ok()) {
    ::rmdir(dir.path.c_str());
    return s;
  }
  return dir;
}

void remove_cgroup(const CgroupDir& dir) {
  for (int attempt = 0; attempt < 200; ++attempt) {
    if (::rmdir(dir.path.c_str()) == 0 || errno == ENOENT) return;
    auto procs = read_file(dir.path + "/cgroup.procs");
    if (procs.ok())
      for (auto pid : split(*procs, '\n'))
        if (auto p = parse_int(trim(pid), "pid"); p.ok() && *p > 0) ::kill(static_cast<pid_t>(*p), SIGKILL);
    ::usleep(1000);
  }
}

// A user namespace whose map sends on-disk owner `from` to uid `to`; for idmapped mounts.
Result<int> idmap_userns(uid_t from_uid, gid_t from_gid, uid_t to_uid, gid_t to_gid) {
  int ready[2], done[2];  // child -> parent: unshared; parent -> child: namespace opened
  if (::pipe2(ready, O_CLOEXEC) != 0 || ::pipe2(done, O_CLOEXEC) != 0) return errno_status(errno, "pipe");
  pid_t pid = ::fork();
  if (pid < 0) return errno_status(errno, "fork");
  if (pid == 0) {
    ::close(ready[0]);
    ::close(done[1]);
    if (::unshare(CLONE_NEWUSER) != 0) _exit(1);
    if (::write(ready[1], "u", 1) != 1) _exit(1);
    char c;
    ssize_t r = ::read(done[0], &c, 1);
    (void)r;
    _exit(0);
  }
  ::close(ready[1]);
  ::close(done[0]);
  const std::string base = fmt::format("/proc/{}/", pid);
  char c;
  Status s;
  ssize_t n;
  do n = ::read(ready[0], &c, 1);
  while (n < 0 && errno == EINTR);
  if (n != 1) s = unavailable("cannot create a user namespace for the idmapped mount");
  int fd = -1;
  if (s.ok()) s = write_text(base + "uid_map", fmt::format("{} {} 1\n", from_uid, to_uid));
  if (s.ok()) s = write_text(base + "setgroups", "deny");
  if (s.ok()) s = write_text(base + "gid_map", fmt::format("{} {} 1\n", from_gid, to_gid));
  if (s.ok()) {
    fd = ::open((base + "ns/user").c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) s = errno_status(errno, "open user namespace");
  }
  ::close(ready[0]);
  ::close(done[1]);
  ::waitpid(pid, nullptr, 0);
  if (!s.ok()) return s;
  return fd;
}

// A detached copy of `path` in which files owned by its owner appear owned by uid/gid.
Result<int> idmapped_tree(const std::string& path, uid_t uid, gid_t gid) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return errno_status(errno, "stat " + path);
  if (st.st_uid == uid) return -1;  // already owned by the sandbox uid: a plain bind does
  int userns = TRY(idmap_userns(st.st_uid, st.st_gid, uid, gid));
  int tree =
      static_cast<int>(::syscall(SYS_open_tree, AT_FDCWD, path.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC));
  if (tree < 0) {
    ::close(userns);
    return errno_status(errno, "open_tree " + path);
  }
  struct mount_attr attr = {};
  attr.attr_set = MOUNT_ATTR_IDMAP;
  attr.userns_fd = static_cast<uint64_t>(userns);
  long r = ::syscall(SYS_mount_setattr, tree, "", AT_EMPTY_PATH, &attr, sizeof(attr));
  int err = errno;
  ::close(userns);
  if (r != 0) {
    ::close(tree);
    return errno_status(err, "idmapped mount of " + path);
  }
  return tree;
}

Result<std::string> canonical(const std::string& path, const char* what) {
  char buf[PATH_MAX];
  if (!::realpath(path.c_str(), buf)) return errno_status(errno, fmt::format("sandbox {} '{}'", what, path));
  return std::string(buf);
}

Status canonicalize(SandboxProfile& p) {
  if (p.workspace.empty()) return invalid_argument("sandbox profile: workspace is empty");
  p.workspace = TRY(canonical(p.workspace, "workspace"));
  for (auto& path : p.read_only) path = TRY(canonical(path, "read_only path"));
  for (auto& path : p.read_write) path = TRY(canonical(path, "read_write path"));
  return {};
}

struct Args {
  bool probe = false;
  std::string profile_json;
  std::vector<std::string> argv;
};

Result<Args> parse_args(int argc, char** argv) {
  Args a;
  int i = 1;
  for (; i < argc; ++i) {
    std::string_view s = argv[i];
    if (s == "--") {
      ++i;
      break;
    }
    if (s == "--probe")
      a.probe = true;
    else if (s == "--profile" && i + 1 < argc)
      a.profile_json = argv[++i];
    else
      return invalid_argument(
          "unknown option '{}' (usage: fathom agent sandbox [--probe] --profile JSON -- CMD ARGS)", s);
  }
  for (; i < argc; ++i) a.argv.emplace_back(argv[i]);
  if (a.argv.empty()) return invalid_argument("no command given after --");
  if (a.profile_json.empty()) a.profile_json = "{}";
  return a;
}

Status write_id_maps(pid_t pid, const ChildSetup& s, bool root) {
  const std::string base = fmt::format("/proc/{}/", pid);
  const uid_t outer_uid = root ? s.uid : ::geteuid();
  const gid_t outer_gid = root ? s.gid : ::getegid();
  if (!root) TRY(write_text(base + "setgroups", "deny"));
  TRY(write_text(base + "uid_map", fmt::format("{} {} 1\n", s.uid, outer_uid)));
  TRY(write_text(base + "gid_map", fmt::format("{} {} 1\n", s.gid, outer_gid)));
  return {};
}

std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR);)
    if (n > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

// Waits for the child; kills it at the wall-clock limit. Returns a shell-style status.
int wait_child(pid_t pid, int64_t timeout_ms, bool* timed_out) {
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  Timer t;
  for (;;) {
    int st = 0;
    pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (r < 0 && errno != EINTR) return 126;
    int wait_ms = 1000;
    if (timeout_ms > 0) {
      const double left = static_cast<double>(timeout_ms) - t.elapsed_ms();
      if (left <= 0) {
        *timed_out = true;
        ::kill(pid, SIGKILL);
        timeout_ms = 0;
        continue;
      }
      wait_ms = static_cast<int>(std::min(left, 1000.0)) + 1;
    }
    if (pidfd >= 0) {
      struct pollfd p = {pidfd, POLLIN, 0};
      ::poll(&p, 1, wait_ms);
    } else {
      ::usleep(1000);
    }
  }
}

}  // namespace

int sandbox_main(int argc, char** argv) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "fathom sandbox: %s\n", s.message().c_str());
    return 126;
  };
  auto args = parse_args(argc, argv);
  if (!args.ok()) return fail(args.status());
  json pj = json::parse(args->profile_json, nullptr, false);
  if (pj.is_discarded()) return fail(invalid_argument("--profile is not JSON"));
  auto profile = SandboxProfile::from_json(pj);
  if (!profile.ok()) return fail(profile.status());
  if (profile->mode == "off") {
    ::execvp(args->argv[0].c_str(), to_argv(args->argv).data());
    return fail(errno_status(errno, "exec " + args->argv[0]));
  }
  if (Status s = canonicalize(*profile); !s.ok()) return fail(s);
  const bool require = profile->mode == "require";
  const bool root = ::geteuid() == 0;

  ChildSetup setup;
  setup.profile = *profile;
  setup.argv = args->argv;
  setup.probe = args->probe;
  setup.uid = root ? profile->uid : ::geteuid();
  setup.gid = root ? profile->gid : ::getegid();
  json& active = setup.report["active"];
  auto note = [&](const std::string& n) { setup.report["notes"].push_back(n); };
  setup.report["notes"] = json::array();

  std::optional<CgroupDir> cgroup;
  if (auto cg = make_pids_cgroup(profile->limits.pids_max); cg.ok()) {
    cgroup = *cg;
    active[fmt::format("pids cgroup v{} (max {})", cg->version, profile->limits.pids_max)] = true;
  } else {
    active["pids cgroup"] = false;
    note("pids cgroup: " + cg.status().message());
    if (require) return fail(cg.status());
  }
  if (root && setup.uid != 0) {
    std::vector<std::string> rw = profile->read_write;
    rw.insert(rw.begin(), profile->workspace);
    for (const auto& path : rw) {
      auto tree = idmapped_tree(path, setup.uid, setup.gid);
      if (tree.ok()) {
        if (*tree >= 0) setup.idmapped.emplace_back(path, *tree);
      } else {
        note(fmt::format("{} is not writable by uid {}: {}", path, setup.uid, tree.status().message()));
        if (require) return fail(tree.status());
      }
    }
  }

  int go[2], err[2], rep[2];
  if (::pipe2(go, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0 || ::pipe2(rep, O_CLOEXEC) != 0)
    return fail(errno_status(errno, "pipe"));
  setup.go_fd = go[0];
  setup.err_fd = err[1];
  setup.report_fd = rep[1];

  int flags =
      CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | (profile->network ? 0 : CLONE_NEWNET);
  std::vector<int> attempts = {flags | CLONE_NEWUSER};
  if (root) attempts.push_back(flags);
  attempts.push_back(0);
  pid_t pid = -1;
  std::string clone_error;
  for (int f : attempts) {
    setup.clone_flags = f;
    pid = clone_child(&setup);
    if (pid > 0) break;
    clone_error += fmt::format("{}clone(0x{:x}): {}", clone_error.empty() ? "" : "; ", f, strerror(errno));
    if (require) return fail(unavailable("namespaces: {}", clone_error));
  }
  if (pid <= 0) return fail(unavailable("cannot start the sandbox: {}", clone_error));
  if (!clone_error.empty()) note("namespaces: " + clone_error);
  ::close(go[0]);
  ::close(err[1]);
  ::close(rep[1]);
  g_child_pid = pid;
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) ::signal(sig, forward_kill);

  Status maps;
  if (setup.clone_flags & CLONE_NEWUSER) maps = write_id_maps(pid, setup, root);
  if (maps.ok() && cgroup) {
    if (Status s = write_text(cgroup->path + "/cgroup.procs", std::to_string(pid)); !s.ok()) {
      note("pids cgroup: " + s.message());
      if (require) maps = s;
    }
  }
  if (!maps.ok()) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    if (cgroup) remove_cgroup(*cgroup);
    return fail(maps);
  }
  if (::write(go[1], "g", 1) != 1) ::kill(pid, SIGKILL);
  ::close(go[1]);
  for (auto& [path, fd] : setup.idmapped) ::close(fd);

  bool timed_out = false;
  const int status = wait_child(pid, profile->limits.wall_timeout_ms, &timed_out);
  const std::string setup_error = read_all(err[0]);
  const std::string report = read_all(rep[0]);
  if (cgroup) remove_cgroup(*cgroup);
  if (timed_out) {
    std::fprintf(stderr, "fathom sandbox: wall-clock limit of %lld ms reached; killed\n",
                 static_cast<long long>(profile->limits.wall_timeout_ms));
    return 124;
  }
  if (!setup_error.empty()) {
    std::fprintf(stderr, "fathom sandbox: %s", setup_error.c_str());
    if (!args->probe) return status == 0 ? 126 : status;
  }
  if (args->probe) {
    json out = setup.report;
    out["ok"] = setup_error.empty() && status == 0;
    if (!setup_error.empty()) out["notes"].push_back(std::string(trim(setup_error)));
    for (auto line : split(report, '\n')) {
      json j = json::parse(line, nullptr, false);
      if (!j.is_object()) continue;
      if (j.contains("active")) out["active"].update(j["active"]);
      if (j.contains("uid")) out["uid"] = j["uid"];
    }
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  return status;
}

}  // namespace fathom::agent
