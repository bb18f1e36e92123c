// `fathom store ...`: the storage service and its clients.
//   store server   run a storage server over one or more target directories
//   store health   a server's state, targets and counters
//   store put|get|ls|rm|stat   the file API
//   store kv put|get|exists|prefix|rm   the KV-cache API (32-byte keys as 64 hex digits)
//   store verify   offline CRC check of a target directory
//   store bench    throughput/IOPS/latency against fio (same as `fathom bench store`)
#include <nlohmann/json.hpp>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "base/fs.h"
#include "base/progress.h"
#include "base/strings.h"
#include "cli/args.h"
#include "cli/bench.h"
#include "cli/command.h"
#include "storage/storage.h"

namespace fathom::cli {
namespace {

using storage::ClientParams;
using storage::StorageClient;

std::vector<std::string> split_servers(const std::vector<std::string>& given) {
  std::vector<std::string> out;
  for (const std::string& g : given) {
    for (std::string_view s : split(g, ',')) {
      if (!trim(s).empty()) out.emplace_back(trim(s));
    }
  }
  return out;
}

// --server options shared by every client subcommand.
struct ClientOptions {
  std::vector<std::string> servers;
  int64_t timeout_ms = 60000;
  void add(Args& args) {
    args.multi("--server", &servers, "storage server HOST:PORT (repeat or comma-separate for several)",
               "HOST:PORT");
    args.option("--timeout-ms", &timeout_ms, "I/O timeout per request", "MS");
  }
  Result<std::unique_ptr<StorageClient>> connect() const {
    const std::vector<std::string> list = split_servers(servers);
    if (list.empty()) return invalid_argument("--server HOST:PORT is required");
    return StorageClient::connect(
        ClientParams{.servers = list, .io_timeout_ms = static_cast<int>(timeout_ms)});
  }
};

int run_server(int argc, char** argv) {
  std::vector<std::string> targets;
  std::string listen = "127.0.0.1:9400", capacity = "0", io = "auto", memory = "1G", max_request = "256M";
  std::string group = "16M", keep_empty = "1G";
  bool no_direct = false;
  int64_t max_inflight = 16, max_connections = 512;
  Args args(argv[0], "Serve storage targets (chunk engine + KV-cache + file API) over TCP.");
  args.multi("--target", &targets, "target directory (repeat for several; created if new)", "DIR");
  args.option("--listen", &listen, "address to listen on (port 0: any free port)", "HOST:PORT");
  args.option("--capacity", &capacity, "cap on each target's data space (0: the disk's free space)", "SIZE");
  args.option("--io", &io, "data I/O: auto, io_uring or psync", "BACKEND");
  args.flag("--no-direct", &no_direct, "buffered I/O instead of O_DIRECT");
  args.option("--max-inflight", &max_inflight, "requests of one client executing at once");
  args.option("--max-connections", &max_connections, "open connections");
  args.option("--memory", &memory, "buffer memory for all requests executing at once", "SIZE");
  args.option("--max-request", &max_request, "data bytes in one request or response", "SIZE");
  args.option("--group-size", &group, "slot-group size of new targets (preallocation unit)", "SIZE");
  args.option("--keep-empty", &keep_empty,
              "emptied slot groups each target keeps allocated for new puts (faster than fresh space)",
              "SIZE");
  args.epilog(
      "Prints 'fathom store server: ready listen=HOST:PORT targets=N' on stdout when serving;\n"
      "SIGINT/SIGTERM stop it gracefully (in-flight requests finish, targets close).");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  storage::ServerParams p;
  auto cap = parse_size(capacity, "--capacity");
  auto mem = parse_size(memory, "--memory");
  auto req = parse_size(max_request, "--max-request");
  auto grp = parse_size(group, "--group-size");
  auto keep = parse_size(keep_empty, "--keep-empty");
  for (const auto* r : {&cap, &mem, &req, &grp, &keep}) {
    if (!r->ok()) return fail(args.command(), r->status());
  }
  for (const std::string& t : targets) p.targets.push_back(storage::TargetParams{t, *cap});
  p.listen = listen;
  p.io = io;
  p.direct_io = !no_direct;
  p.memory_bytes = *mem;
  p.max_request_bytes = *req;
  p.group_bytes = *grp;
  p.keep_empty_bytes = *keep;
  p.max_inflight_per_client = static_cast<int>(max_inflight);
  p.max_connections = static_cast<int>(max_connections);
  // Signals are taken by sigwait below; block them before any server thread exists.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  auto server = storage::StorageServer::start(p);
  if (!server.ok()) return fail(args.command(), server.status());
  std::printf("fathom store server: ready listen=%s targets=%zu\n", (*server)->address().c_str(),
              p.targets.size());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&set, &sig);
  std::fprintf(stderr, "fathom store server: %s, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  (*server)->stop();
  std::printf("fathom store server: stopped\n");
  return 0;
}

void print_health(const storage::ServerHealth& h, const std::string& server) {
  std::printf(
      "server %s: %s, up %.1f s, %u connections, %llu requests (%llu replayed), cpu %.2f s user %.2f s sys\n",
      server.c_str(), h.ready ? "ready" : "draining", h.uptime_ms / 1e3, h.connections,
      static_cast<unsigned long long>(h.requests), static_cast<unsigned long long>(h.replayed_requests),
      h.cpu_user_us / 1e6, h.cpu_system_us / 1e6);
  for (const auto& t : h.targets) {
    std::printf(
        "  target %u (chain %u) %s [%s%s]: %llu chunks, %s live, %s reserved of %s; %llu reads, %llu writes, "
        "%llu evictions, %llu checksum errors\n",
        t.info.target_id, t.info.chain_id, t.info.path.c_str(), t.io_backend.c_str(),
        t.direct_io ? " O_DIRECT" : "", static_cast<unsigned long long>(t.chunks),
        format_bytes(t.live_bytes).c_str(), format_bytes(t.reserved_bytes).c_str(),
        t.info.capacity_bytes ? format_bytes(t.info.capacity_bytes).c_str() : "disk",
        static_cast<unsigned long long>(t.reads), static_cast<unsigned long long>(t.writes),
        static_cast<unsigned long long>(t.evictions), static_cast<unsigned long long>(t.checksum_errors));
  }
}

nlohmann::json health_json(const storage::ServerHealth& h) {
  nlohmann::json targets = nlohmann::json::array();
  for (const auto& t : h.targets) {
    targets.push_back({{"target_id", t.info.target_id},
                       {"chain_id", t.info.chain_id},
                       {"path", t.info.path},
                       {"io", t.io_backend},
                       {"direct", t.direct_io},
                       {"chunks", t.chunks},
                       {"live_bytes", t.live_bytes},
                       {"used_slot_bytes", t.used_slot_bytes},
                       {"reserved_bytes", t.reserved_bytes},
                       {"capacity_bytes", t.info.capacity_bytes},
                       {"reads", t.reads},
                       {"writes", t.writes},
                       {"removes", t.removes},
                       {"evictions", t.evictions},
                       {"expirations", t.expirations},
                       {"checksum_errors", t.checksum_errors},
                       {"quarantined_slots", t.quarantined_slots}});
  }
  return {{"ready", h.ready},
          {"server_id", h.server_id},
          {"uptime_ms", h.uptime_ms},
          {"connections", h.connections},
          {"requests", h.requests},
          {"replayed_requests", h.replayed_requests},
          {"cpu_user_us", h.cpu_user_us},
          {"cpu_system_us", h.cpu_system_us},
          {"targets", targets}};
}

int run_health(int argc, char** argv) {
  ClientOptions c;
  bool json = false;
  Args args(argv[0], "Show a storage server's state, targets and counters (exit 0 when ready).");
  c.add(args);
  args.flag("--json", &json, "print one JSON object");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  auto client = c.connect();
  if (!client.ok()) return fail(args.command(), client.status());
  nlohmann::json all = nlohmann::json::array();
  bool ready = true;
  for (size_t s = 0; s < (*client)->server_count(); ++s) {
    auto h = (*client)->health(s);
    if (!h.ok()) return fail(args.command(), h.status());
    ready &= h->ready;
    if (json) {
      all.push_back(health_json(*h));
    } else {
      print_health(*h, split_servers(c.servers)[s]);
    }
  }
  if (json) print_json_line(nlohmann::json{{"servers", all}}.dump());
  return ready ? 0 : 1;
}

int run_file_cmd(int argc, char** argv, const std::string& verb) {
  ClientOptions c;
  std::string a, b, chunk = "4M";
  bool json = false;
  int64_t parallel = 4;
  Args args(argv[0], verb == "put"   ? "Upload a local file (replaces REMOTE atomically)."
                     : verb == "get" ? "Download REMOTE to a local file (verified, then renamed into place)."
                     : verb == "ls"  ? "List remote files under a prefix."
                     : verb == "rm"  ? "Remove a remote file."
                                     : "Show a remote file's size, chunks and checksum.");
  c.add(args);
  if (verb == "put") {
    args.positional("LOCAL", &a, "local file");
    args.positional("REMOTE", &b, "remote path");
    args.option("--chunk-size", &chunk, "chunk size (4K..64M)", "SIZE");
  } else if (verb == "get") {
    args.positional("REMOTE", &a, "remote path");
    args.positional("LOCAL", &b, "local file");
  } else if (verb == "ls") {
    args.positional("PREFIX", &a, "path prefix (default: everything)", false);
  } else {
    args.positional("REMOTE", &a, "remote path");
  }
  if (verb == "put" || verb == "get") args.option("--parallel", &parallel, "requests in flight");
  if (verb == "ls" || verb == "stat") args.flag("--json", &json, "print one JSON object");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  auto chunk_bytes = parse_size(chunk, "--chunk-size");
  if (!chunk_bytes.ok()) return fail(args.command(), chunk_bytes.status());
  auto client = c.connect();
  if (!client.ok()) return fail(args.command(), client.status());
  storage::FileStore files(**client,
                           storage::FileStoreParams{.chunk_bytes = static_cast<uint32_t>(*chunk_bytes),
                                                    .parallel = static_cast<int>(parallel)});
  auto info_json = [](const storage::FileInfo& f) {
    return nlohmann::json{{"path", f.path},     {"size", f.size},     {"chunk_bytes", f.chunk_bytes},
                          {"chunks", f.chunks}, {"crc32c", f.crc32c}, {"mtime_ms", f.mtime_ms},
                          {"inode", f.inode}};
  };
  Status s;
  if (verb == "put") {
    s = files.put(a, b);
  } else if (verb == "get") {
    s = files.get(a, b);
  } else if (verb == "rm") {
    s = files.remove(a);
  } else if (verb == "ls") {
    auto list = files.list(a);
    if (!list.ok()) return fail(args.command(), list.status());
    nlohmann::json j = nlohmann::json::array();
    for (const auto& f : *list) {
      if (json) {
        j.push_back(info_json(f));
      } else {
        std::printf("%12llu  %s\n", static_cast<unsigned long long>(f.size), f.path.c_str());
      }
    }
    if (json) print_json_line(nlohmann::json{{"files", j}}.dump());
  } else {
    auto f = files.stat(a);
    if (!f.ok()) return fail(args.command(), f.status());
    if (json) {
      print_json_line(info_json(*f).dump());
    } else {
      std::printf("%s: %llu bytes in %llu chunks of %s, crc32c %08x, inode %s\n", f->path.c_str(),
                  static_cast<unsigned long long>(f->size), static_cast<unsigned long long>(f->chunks),
                  format_bytes(f->chunk_bytes).c_str(), f->crc32c, f->inode.c_str());
    }
  }
  if (!s.ok()) return fail(args.command(), s);
  return 0;
}

Result<std::vector<storage::KvKey>> parse_keys(const std::vector<std::string>& hex) {
  std::vector<storage::KvKey> keys;
  for (const std::string& h : hex) keys.push_back(TRY(storage::parse_kv_key(h)));
  if (keys.empty()) return invalid_argument("no KEY given (64 hex digits each)");
  return keys;
}

int run_kv(int argc, char** argv) {
  static const char* kUsage =
      "usage: fathom store kv <put|get|exists|prefix|rm> [options] KEY...   (KEY: 64 hex digits)\n"
      "  put KEY FILE|-   store a block (kept if the key is cached already)\n"
      "  get KEY [FILE]   write the block to FILE or stdout (exit 3 on a miss)\n"
      "  exists KEY...    print 1/0 per key\n"
      "  prefix KEY...    how many leading keys of the chain are cached\n"
      "  rm KEY...        remove blocks\n";
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0) {
    std::printf("%s", kUsage);
    return argc < 2 ? 2 : 0;
  }
  const std::string verb = argv[1];
  std::string name = std::string(argv[0]) + " " + verb;
  argv[1] = name.data();
  ClientOptions c;
  std::vector<std::string> rest;
  int64_t ttl = 0, lease = 0;
  Args args(name, "KV-cache blocks keyed by 32-byte prefix hashes.");
  c.add(args);
  args.rest("ARGS", &rest, "KEY (and FILE for put/get), or KEYs");
  if (verb == "put") args.option("--ttl", &ttl, "seconds until the block expires (0: never)", "S");
  if (verb == "get" || verb == "exists" || verb == "prefix") {
    args.option("--lease-ms", &lease, "protect the hits from eviction this long", "MS");
  }
  auto parsed = args.parse(argc - 1, argv + 1);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  auto client = c.connect();
  if (!client.ok()) return fail(args.command(), client.status());
  storage::KvCache kv(**client);
  if (verb == "put" || verb == "get") {
    if (rest.empty() || rest.size() > 2 || (verb == "put" && rest.size() != 2)) {
      return fail(args.command(), invalid_argument("expected KEY {}", verb == "put" ? "FILE|-" : "[FILE]"));
    }
  }
  auto keys = parse_keys(
      verb == "put" || verb == "get" ? std::vector<std::string>{rest.empty() ? "" : rest[0]} : rest);
  if (!keys.ok()) return fail(args.command(), keys.status());
  if (verb == "put") {
    std::string data;
    if (rest[1] == "-") {
      char buf[65536];
      for (size_t n; (n = std::fread(buf, 1, sizeof(buf), stdin)) > 0;) data.append(buf, n);
    } else {
      auto file = read_file(rest[1]);
      if (!file.ok()) return fail(args.command(), file.status());
      data = std::move(*file);
    }
    Status s = kv.put((*keys)[0], std::span(reinterpret_cast<const uint8_t*>(data.data()), data.size()),
                      static_cast<uint32_t>(ttl));
    return s.ok() ? 0 : fail(args.command(), s);
  }
  if (verb == "get") {
    auto v = kv.get((*keys)[0], static_cast<uint32_t>(lease));
    if (!v.ok()) return fail(args.command(), v.status());
    if (!v->has_value()) {
      std::fprintf(stderr, "%s: miss\n", args.command().c_str());
      return 3;
    }
    const std::string_view bytes(reinterpret_cast<const char*>((*v)->data()), (*v)->size());
    if (rest.size() == 2) {
      Status s = write_file_atomic(rest[1], bytes);
      return s.ok() ? 0 : fail(args.command(), s);
    }
    std::fwrite(bytes.data(), 1, bytes.size(), stdout);
    return 0;
  }
  if (verb == "exists") {
    auto e = kv.exists(*keys, static_cast<uint32_t>(lease));
    if (!e.ok()) return fail(args.command(), e.status());
    for (size_t i = 0; i < e->size(); ++i) std::printf("%s %d\n", rest[i].c_str(), (*e)[i] ? 1 : 0);
    return 0;
  }
  if (verb == "prefix") {
    auto n = kv.longest_prefix(*keys, static_cast<uint32_t>(lease));
    if (!n.ok()) return fail(args.command(), n.status());
    std::printf("%zu\n", *n);
    return 0;
  }
  if (verb == "rm") {
    auto n = kv.remove(*keys);
    if (!n.ok()) return fail(args.command(), n.status());
    std::printf("removed %zu\n", *n);
    return 0;
  }
  std::fprintf(stderr, "%s", kUsage);
  return 2;
}

int run_verify(int argc, char** argv) {
  std::vector<std::string> targets;
  bool json = false;
  Args args(argv[0], "Check every chunk of target directories offline (stop the server first).");
  args.rest("DIR", &targets, "target directories");
  args.flag("--json", &json, "print one JSON object");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  if (targets.empty()) return fail(args.command(), invalid_argument("no target DIR given"));
  bool clean = true;
  nlohmann::json all = nlohmann::json::array();
  for (const std::string& dir : targets) {
    auto r = storage::verify_target(dir);
    if (!r.ok()) return fail(args.command(), r.status());
    clean &= r->corrupt_ids.empty();
    if (json) {
      all.push_back({{"dir", dir},
                     {"target_id", r->target_id},
                     {"chunks", r->chunks},
                     {"live_bytes", r->live_bytes},
                     {"corrupt", r->corrupt_ids}});
      continue;
    }
    std::printf("%s: target %u, %llu chunks, %s, %zu corrupt\n", dir.c_str(), r->target_id,
                static_cast<unsigned long long>(r->chunks), format_bytes(r->live_bytes).c_str(),
                r->corrupt_ids.size());
    for (const std::string& id : r->corrupt_ids) std::printf("  corrupt: %s\n", id.c_str());
  }
  if (json) print_json_line(nlohmann::json{{"targets", all}, {"clean", clean}}.dump());
  return clean ? 0 : 1;
}

int run_store(int argc, char** argv) {
  static const char* kUsage =
      "usage: fathom store <command> [options]     fathom store <command> --help\n\n"
      "commands:\n"
      "  server   serve target directories over TCP\n"
      "  health   a server's state, targets and counters\n"
      "  put      upload a file          get   download a file\n"
      "  ls       list files             rm    remove a file        stat  file details\n"
      "  kv       KV-cache blocks: put, get, exists, prefix, rm\n"
      "  verify   offline CRC check of target directories\n"
      "  bench    put/get GB/s, 4 KiB IOPS and latency against fio on the same disk\n";
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::printf("%s", kUsage);
    return argc < 2 ? 2 : 0;
  }
  const std::string sub = argv[1];
  std::string name = std::string(argv[0]) + " " + sub;
  argv[1] = name.data();
  if (sub == "server") return run_server(argc - 1, argv + 1);
  if (sub == "health") return run_health(argc - 1, argv + 1);
  if (sub == "kv") return run_kv(argc - 1, argv + 1);
  if (sub == "verify") return run_verify(argc - 1, argv + 1);
  if (sub == "put" || sub == "get" || sub == "ls" || sub == "rm" || sub == "stat") {
    return run_file_cmd(argc - 1, argv + 1, sub);
  }
  if (sub == "bench") {
    for (const auto& b : benches()) {
      if (std::string_view(b.name) == "store") return b.run(argc - 1, argv + 1);
    }
  }
  std::fprintf(stderr, "fathom store: unknown command '%s'\n%s", sub.c_str(), kUsage);
  return 2;
}

}  // namespace

FATHOM_COMMAND("store", "3FS-style storage: server, file and KV-cache clients, verify, bench", run_store);

}  // namespace fathom::cli
