// The inside half of the sandbox: runs in the cloned child (PID 1 of the new namespaces). Builds
// the pivot_root view, drops to the unprivileged uid, sets no_new_privs, rlimits and the seccomp
// filter, then forks CMD and reaps like an init. Probe mode checks each protection from inside.
#include <fcntl.h>
#include <grp.h>
#include <linux/sched.h>
#include <net/if.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <sys/fsuid.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "agent/sandbox_impl.h"
#include "base/fs.h"
#include "base/strings.h"

#if defined(__SANITIZE_ADDRESS__)
#define FATHOM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FATHOM_ASAN 1
#endif
#endif
#if defined(FATHOM_ASAN)
#include <sanitizer/common_interface_defs.h>
#endif

namespace fathom::agent {
namespace {

using json = nlohmann::json;

constexpr const char* kRoot = "/tmp";  // the new root's tmpfs is mounted here before pivot_root
volatile sig_atomic_t g_cmd_pid = 0;
// The cloned child's stack (clone_child). The helper clones from one thread, one child at a time.
constexpr size_t kStack = 1 << 20;
std::vector<char>& child_stack() {
  static std::vector<char> stack(kStack);
  return stack;
}

void forward_signal(int sig) {
  if (g_cmd_pid > 0) ::kill(g_cmd_pid, sig);
}

[[noreturn]] void die(const ChildSetup& s, const std::string& msg, int code = 126) {
  std::string line = msg + "\n";
  if (::write(s.err_fd, line.data(), line.size()) < 0) {
  }
  _exit(code);
}

Status mkdirs(const std::string& path) {
  std::string cur;
  for (auto part : split(path, '/')) {
    if (part.empty()) continue;
    cur += "/" + std::string(part);
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return errno_status(errno, "mkdir " + cur);
  }
  return {};
}

// Creates the mount point (a directory, or an empty file for a file) inside the new root.
Status make_target(const std::string& target, bool is_dir) {
  if (is_dir) return mkdirs(target);
  TRY(mkdirs(target.substr(0, target.rfind('/'))));
  int fd = ::open(target.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0 && errno != EEXIST) return errno_status(errno, "create " + target);
  if (fd >= 0) ::close(fd);
  return {};
}

// Read-only remount of a bind mount, keeping the flags a user namespace may not clear.
Status remount_read_only(const std::string& target) {
  struct statvfs sv;
  unsigned long flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV;
  if (::statvfs(target.c_str(), &sv) == 0) {
    if (sv.f_flag & ST_NOEXEC) flags |= MS_NOEXEC;
    if (sv.f_flag & ST_NOATIME) flags |= MS_NOATIME;
    if (sv.f_flag & ST_NODIRATIME) flags |= MS_NODIRATIME;
    if (sv.f_flag & ST_RELATIME) flags |= MS_RELATIME;
  }
  if (::mount(nullptr, target.c_str(), nullptr, flags, nullptr) != 0)
    return errno_status(errno, "remount read-only " + target);
  return {};
}

struct Bind {
  std::string path;  // the real path, also the path inside
  int fd = -1;       // O_PATH handle opened before the new root hid anything
  bool is_dir = true;
  bool read_only = true;
  int idmapped_fd = -1;
  std::string symlink;  // when the source is a symlink: recreate it instead
};

Result<Bind> open_bind(const std::string& path, bool read_only, bool follow) {
  Bind b{.path = path, .read_only = read_only};
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return errno_status(errno, "stat " + path);
  if (S_ISLNK(st.st_mode) && !follow) {
    char buf[4096];
    ssize_t n = ::readlink(path.c_str(), buf, sizeof(buf) - 1);
    if (n < 0) return errno_status(errno, "readlink " + path);
    b.symlink.assign(buf, static_cast<size_t>(n));
    return b;
  }
  b.fd = ::open(path.c_str(), O_PATH | O_CLOEXEC);
  if (b.fd < 0) return errno_status(errno, "open " + path);
  if (::fstat(b.fd, &st) != 0) return errno_status(errno, "stat " + path);
  b.is_dir = S_ISDIR(st.st_mode);
  return b;
}

Status mount_bind(const Bind& b) {
  const std::string target = std::string(kRoot) + b.path;
  if (!b.symlink.empty()) {
    TRY(mkdirs(target.substr(0, target.rfind('/'))));
    if (::symlink(b.symlink.c_str(), target.c_str()) != 0 && errno != EEXIST)
      return errno_status(errno, "symlink " + target);
    return {};
  }
  TRY(make_target(target, b.is_dir));
  if (b.idmapped_fd >= 0) {
    if (::syscall(SYS_move_mount, b.idmapped_fd, "", AT_FDCWD, target.c_str(), MOVE_MOUNT_F_EMPTY_PATH) != 0)
      return errno_status(errno, "attach idmapped " + b.path);
    return {};
  }
  const std::string source = fmt::format("/proc/self/fd/{}", b.fd);
  if (::mount(source.c_str(), target.c_str(), nullptr, MS_BIND, nullptr) != 0)
    return errno_status(errno, "bind " + b.path);
  if (b.read_only) TRY(remount_read_only(target));
  return {};
}

Status mount_dev() {
  const std::string dev = std::string(kRoot) + "/dev";
  TRY(mkdirs(dev));
  if (::mount("tmpfs", dev.c_str(), "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k") != 0)
    return errno_status(errno, "mount /dev");
  for (const char* node : {"null", "zero", "full", "random", "urandom", "tty"}) {
    const std::string src = std::string("/dev/") + node, target = dev + "/" + node;
    if (!path_exists(src)) continue;
    TRY(make_target(target, false));
    if (::mount(src.c_str(), target.c_str(), nullptr, MS_BIND, nullptr) != 0)
      return errno_status(errno, "bind " + src);
  }
  for (auto [name, to] : {std::pair{"fd", "/proc/self/fd"},
                          {"stdin", "/proc/self/fd/0"},
                          {"stdout", "/proc/self/fd/1"},
                          {"stderr", "/proc/self/fd/2"}})
    if (::symlink(to, (dev + "/" + name).c_str()) != 0)
      return errno_status(errno, "symlink /dev/" + std::string(name));
  return {};
}

// Builds the view: system directories and extra read-only paths, the workspace and read-write
// paths, /dev, /proc, a private /tmp; then pivot_root into it.
Status build_view(const ChildSetup& s) {
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
    return errno_status(errno, "make / private");
  std::vector<Bind> binds;
  for (const char* sys : {"/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", "/etc"}) {
    if (!path_exists(sys)) continue;
    binds.push_back(TRY(open_bind(sys, true, false)));
  }
  for (const auto& p : s.profile.read_only) binds.push_back(TRY(open_bind(p, true, true)));
  std::vector<std::string> rw = s.profile.read_write;
  rw.insert(rw.begin(), s.profile.workspace);
  for (const auto& p : rw) {
    Bind b = TRY(open_bind(p, false, true));
    for (const auto& [path, fd] : s.idmapped)
      if (path == p) b.idmapped_fd = fd;
    binds.push_back(b);
  }
  // Files made in the new root must have an owner the user namespace maps (root may not be).
  if (s.clone_flags & CLONE_NEWUSER) {
    ::setfsgid(s.gid);
    ::setfsuid(s.uid);
  }
  if (::mount("tmpfs", kRoot, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m") != 0)
    return errno_status(errno, "mount the new root");
  const std::string proc = std::string(kRoot) + "/proc", tmp = std::string(kRoot) + "/tmp";
  // The private /tmp first, so paths under /tmp (a workspace there) are bound on top of it.
  if (s.profile.workspace != "/tmp") {
    TRY(mkdirs(tmp));
    const std::string opts = fmt::format("mode=1777,size={}", s.profile.limits.tmp_bytes);
    if (::mount("tmpfs", tmp.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, opts.c_str()) != 0)
      return errno_status(errno, "mount /tmp");
  }
  for (const auto& b : binds) TRY(mount_bind(b));
  TRY(mount_dev());
  TRY(mkdirs(proc));
  if (::mount("proc", proc.c_str(), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0)
    return errno_status(errno, "mount /proc");
  if (::mount(nullptr, kRoot, nullptr, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, nullptr) != 0)
    return errno_status(errno, "make the new root read-only");
  if (::chdir(kRoot) != 0) return errno_status(errno, "chdir new root");
  if (::syscall(SYS_pivot_root, ".", ".") != 0) return errno_status(errno, "pivot_root");
  if (::umount2(".", MNT_DETACH) != 0) return errno_status(errno, "detach the old root");
  if (::chdir("/") != 0) return errno_status(errno, "chdir /");
  return {};
}

Status drop_privileges(const ChildSetup& s) {
  if (::setgroups(0, nullptr) != 0 && errno != EPERM) return errno_status(errno, "setgroups");
  if (::setresgid(s.gid, s.gid, s.gid) != 0) return errno_status(errno, fmt::format("setresgid {}", s.gid));
  if (::setresuid(s.uid, s.uid, s.uid) != 0) return errno_status(errno, fmt::format("setresuid {}", s.uid));
  if (::getuid() != s.uid || ::geteuid() != s.uid)
    return permission_denied("uid did not change to {}", s.uid);
  return {};
}

Status set_limits(const ChildSetup& s, bool have_pids_cgroup) {
  const SandboxLimits& l = s.profile.limits;
  auto set = [](int res, int64_t v, const char* name) -> Status {
    if (v <= 0) return {};
    struct rlimit rl = {static_cast<rlim_t>(v), static_cast<rlim_t>(v)};
    if (::setrlimit(res, &rl) != 0) return errno_status(errno, fmt::format("setrlimit {}", name));
    return {};
  };
  TRY(set(RLIMIT_CPU, l.cpu_seconds, "CPU"));
  TRY(set(RLIMIT_AS, l.address_space_bytes, "AS"));
  TRY(set(RLIMIT_NOFILE, l.open_files, "NOFILE"));
  TRY(set(RLIMIT_FSIZE, l.file_size_bytes, "FSIZE"));
  TRY(set(RLIMIT_CORE, 0, "CORE"));
  struct rlimit core = {0, 0};
  ::setrlimit(RLIMIT_CORE, &core);
  // RLIMIT_NPROC counts every process of the uid system-wide; without the cgroup it is the only
  // process limit left (it binds here because the uid is not root).
  if (!have_pids_cgroup) TRY(set(RLIMIT_NPROC, l.pids_max, "NPROC"));
  return {};
}

Status load_seccomp() {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (!ctx) return internal_error("seccomp_init failed");
  struct Guard {
    scmp_filter_ctx c;
    ~Guard() { seccomp_release(c); }
  } guard{ctx};
  seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
  const char* denied[] = {"ptrace",
                          "mount",
                          "umount2",
                          "pivot_root",
                          "chroot",
                          "swapon",
                          "swapoff",
                          "reboot",
                          "kexec_load",
                          "kexec_file_load",
                          "init_module",
                          "finit_module",
                          "delete_module",
                          "add_key",
                          "request_key",
                          "keyctl",
                          "unshare",
                          "setns",
                          "bpf",
                          "perf_event_open",
                          "userfaultfd",
                          "open_by_handle_at",
                          "name_to_handle_at",
                          "process_vm_readv",
                          "process_vm_writev",
                          "acct",
                          "settimeofday",
                          "clock_settime",
                          "clock_adjtime",
                          "adjtimex",
                          "iopl",
                          "ioperm",
                          "quotactl",
                          "lookup_dcookie",
                          "mount_setattr",
                          "open_tree",
                          "move_mount",
                          "fsopen",
                          "fsconfig",
                          "fsmount",
                          "fspick",
                          "syslog",
                          "vhangup",
                          "fanotify_init",
                          "pidfd_getfd",
                          "kcmp"};
  for (const char* name : denied) {
    int nr = seccomp_syscall_resolve_name(name);
    if (nr == __NR_SCMP_ERROR) continue;  // not on this architecture
    if (int rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0); rc != 0)
      return internal_error("seccomp rule for {}: {}", name, strerror(-rc));
  }
  for (unsigned long flag :
       std::initializer_list<unsigned long>{CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET,
                                            CLONE_NEWIPC, CLONE_NEWUTS, CLONE_NEWCGROUP}) {
    if (int rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                                  SCMP_A0(SCMP_CMP_MASKED_EQ, flag, flag));
        rc != 0)
      return internal_error("seccomp clone rule: {}", strerror(-rc));
  }
  // clone3 hides its flags in memory a filter cannot read: make callers fall back to clone.
  if (int nr = seccomp_syscall_resolve_name("clone3"); nr != __NR_SCMP_ERROR)
    if (int rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), nr, 0); rc != 0)
      return internal_error("seccomp clone3 rule: {}", strerror(-rc));
  for (unsigned long req : {static_cast<unsigned long>(TIOCSTI), static_cast<unsigned long>(TIOCLINUX)})
    if (int rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
                                  SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, req));
        rc != 0)
      return internal_error("seccomp ioctl rule: {}", strerror(-rc));
  if (int rc = seccomp_load(ctx); rc != 0) return internal_error("seccomp_load: {}", strerror(-rc));
  return {};
}

std::string status_field(const std::string& status, const std::string& key) {
  for (auto line : split(status, '\n'))
    if (starts_with(line, key + ":")) return std::string(trim(line.substr(key.size() + 1)));
  return "";
}

// Probe mode: checks from inside what is in force and reports it as one JSON line.
void probe_inside(const ChildSetup& s) {
  json a = json::object();
  const std::string status = read_file("/proc/self/status").value_or("");
  a["seccomp filter"] = status_field(status, "Seccomp") == "2";
  a["no_new_privs"] = status_field(status, "NoNewPrivs") == "1";
  a["unprivileged uid"] = ::getuid() != 0 && ::geteuid() != 0;
  if (s.clone_flags & CLONE_NEWPID) a["pid namespace"] = ::getpid() == 2;
  if (!s.profile.network) {
    int n = 0;
    if (struct if_nameindex* ifs = if_nameindex()) {
      for (auto* i = ifs; i->if_index != 0; ++i) ++n;
      if_freenameindex(ifs);
    }
    a["network namespace (no network)"] = (s.clone_flags & CLONE_NEWNET) && n <= 1;
  }
  a["private mount view"] = (s.clone_flags & CLONE_NEWNS) && !path_exists("/root") && !path_exists("/home");
  const std::string probe_file = s.profile.workspace + "/.fathom-sandbox-probe";
  int fd = ::open(probe_file.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  a["workspace writable"] = fd >= 0;
  if (fd >= 0) ::close(fd), ::unlink(probe_file.c_str());
  json line = {{"active", a}, {"uid", ::getuid()}};
  std::string text = line.dump() + "\n";
  if (::write(s.report_fd, text.data(), text.size()) < 0) {
  }
}

int child_main(void* arg) {
#if defined(FATHOM_ASAN)
  // This process runs on child_stack(), not on the thread stack AddressSanitizer recorded, so each
  // call of a noreturn function (_exit) would print "ASan is ignoring requested
  // __asan_handle_no_return" into the command's stderr. Declare the switch as a fiber switch.
  __sanitizer_start_switch_fiber(nullptr, child_stack().data(), child_stack().size());
  __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
  ChildSetup& s = *static_cast<ChildSetup*>(arg);
  char go;
  if (::read(s.go_fd, &go, 1) != 1) _exit(126);  // the helper died before the maps were written
  ::close(s.go_fd);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  json a = json::object();
  const bool ns = s.clone_flags != 0;
  a["user namespace"] = (s.clone_flags & CLONE_NEWUSER) != 0;
  a["mount namespace + pivot_root"] = (s.clone_flags & CLONE_NEWNS) != 0;
  a["ipc/uts namespaces"] = (s.clone_flags & CLONE_NEWIPC) != 0;
  if (s.profile.network) a["network granted by the manifest"] = true;
  if (s.clone_flags & CLONE_NEWNS)
    if (Status st = build_view(s); !st.ok()) die(s, "building the sandbox view: " + st.message());
  if (s.clone_flags & CLONE_NEWUTS) (void)::sethostname("fathom-sandbox", 14);
  const bool root_before = ::geteuid() == 0;
  if (ns || root_before)
    if (Status st = drop_privileges(s); !st.ok()) die(s, "dropping privileges: " + st.message());
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) die(s, "no_new_privs: " + std::string(strerror(errno)));
  const bool have_cgroup = s.report.contains("active") && [&] {
    for (auto& [k, v] : s.report["active"].items())
      if (starts_with(k, "pids cgroup v")) return true;
    return false;
  }();
  if (Status st = set_limits(s, have_cgroup); !st.ok()) die(s, st.message());
  a["rlimits"] = true;
  if (Status st = load_seccomp(); !st.ok()) die(s, st.message());
  if (s.probe) {
    json line = {{"active", a}};
    std::string text = line.dump() + "\n";
    if (::write(s.report_fd, text.data(), text.size()) < 0) {
    }
  }
  ::setenv("FATHOM_SANDBOX", "1", 1);
  if (::chdir(s.profile.workspace.c_str()) != 0)
    die(s, "chdir to the workspace: " + std::string(strerror(errno)));

  pid_t cmd = ::fork();
  if (cmd < 0) die(s, "fork: " + std::string(strerror(errno)));
  if (cmd == 0) {
    if (s.probe) {
      probe_inside(s);
      _exit(0);
    }
    ::close(s.report_fd);
    auto argv = to_argv(s.argv);
    ::execvp(argv[0], argv.data());
    die(s, fmt::format("exec '{}': {}", s.argv[0], strerror(errno)), 127);
  }
  g_cmd_pid = cmd;
  ::close(s.err_fd);
  ::close(s.report_fd);
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) ::signal(sig, forward_signal);
  for (;;) {  // PID 1: reap everything; leave with the command's status
    int st = 0;
    pid_t r = ::waitpid(-1, &st, 0);
    if (r == cmd) _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    if (r < 0 && errno == ECHILD) _exit(126);
  }
}

}  // namespace

std::vector<char*> to_argv(const std::vector<std::string>& args) {
  std::vector<char*> out;
  for (const auto& a : args) out.push_back(const_cast<char*>(a.c_str()));
  out.push_back(nullptr);
  return out;
}

pid_t clone_child(ChildSetup* setup) {
  std::vector<char>& stack = child_stack();
  return ::clone(child_main, stack.data() + stack.size(), setup->clone_flags | SIGCHLD, setup);
}

}  // namespace fathom::agent
