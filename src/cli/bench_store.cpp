// `fathom bench store` (also `fathom store bench`): put/get throughput, IOPS and latency of the
// storage service through the KV-cache API (the engine's hot path), with fio running the
// equivalent direct-I/O jobs on the server's own target filesystem in the same run.
//   put  vs fio sequential write, O_DIRECT, same block size and queue depth, fdatasync per batch
//        (our puts are durable: data fdatasync'ed + one synced RocksDB commit per request)
//   get  vs fio random read, O_DIRECT, same block size and queue depth
//   4 KiB random get vs fio 4 KiB random read at the same queue depth
// Queue depth = --threads requests in flight x --batch blocks per request. CPU per GB/s counts
// this process (and the server's, from its health RPC, when it runs elsewhere).
// Every phase runs --rounds times, each time next to its fio job, alternating which goes first, and
// the ratios are of the totals: a shared virtual disk's throughput drifts (and bursts) over
// seconds, so one get and one fio read measured tens of seconds apart compare mostly noise.
#include <sys/resource.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <thread>

#include "base/progress.h"
#include "base/rng.h"
#include "base/strings.h"
#include "base/timer.h"
#include "cli/args.h"
#include "cli/bench.h"
#include "storage/storage.h"

namespace fathom::cli {
namespace {

using storage::KvKey;

struct Options {
  std::vector<std::string> servers;
  std::string dir;
  std::string block = "2M";
  int64_t batch = 8;
  int64_t threads = 2;
  std::string bytes = "1G";
  int64_t rounds = 3;
  double rand_seconds = 1;
  std::string rand_bytes = "64M";
  std::string split = "2M";
  uint64_t split_bytes = 0;  // --request-split, parsed
  std::string keep_empty = "1G";
  uint64_t keep_empty_bytes = 0;  // --keep-empty, parsed
  bool no_fio = false;
  bool json = false;
};

double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5))];
}

struct PhaseResult {
  double seconds = 0, bytes = 0, ops = 0, cpu_s = 0, p50_ms = 0, p99_ms = 0;
  uint64_t errors = 0;
  std::string first_error;
  std::vector<double> lat_ms;  // one per request
  void add(const PhaseResult& o) {
    seconds += o.seconds, bytes += o.bytes, ops += o.ops, cpu_s += o.cpu_s;
    if (errors == 0 && o.errors > 0) first_error = o.first_error;
    errors += o.errors;
    lat_ms.insert(lat_ms.end(), o.lat_ms.begin(), o.lat_ms.end());
    p50_ms = percentile(lat_ms, 0.5);
    p99_ms = percentile(lat_ms, 0.99);
  }
  double gbs() const { return seconds > 0 ? bytes / seconds / 1e9 : 0; }
  double iops() const { return seconds > 0 ? ops / seconds : 0; }
  double cores_per_gbs() const { return gbs() > 0 ? cpu_s / seconds / gbs() : 0; }
  nlohmann::json to_json() const {
    return {{"seconds", seconds},
            {"bytes", bytes},
            {"ops", ops},
            {"gbs", gbs()},
            {"iops", iops()},
            {"request_p50_ms", p50_ms},
            {"request_p99_ms", p99_ms},
            {"cpu_seconds", cpu_s},
            {"cpu_cores_per_gbs", cores_per_gbs()},
            {"errors", errors}};
  }
};

// Runs fn(thread, batch_index) on `threads` threads until `batches` are done (or `seconds` pass
// when batches is 0), timing every batch; fn returns (bytes, ops, error).
struct BatchOutcome {
  double bytes = 0, ops = 0;
  Status error;
};
PhaseResult run_phase(int threads, uint64_t batches, double seconds, storage::StorageClient& client,
                      bool remote, const std::function<BatchOutcome(int, uint64_t)>& fn) {
  std::atomic<uint64_t> next{0};
  std::mutex mu;
  PhaseResult r;
  std::vector<double> lat;
  auto server_cpu = [&] {
    if (!remote) return 0.0;
    auto h = client.health(0);
    return h.ok() ? (h->cpu_user_us + h->cpu_system_us) * 1e-6 : 0.0;
  };
  const double cpu0 = cpu_seconds() + server_cpu();
  Timer wall;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (;;) {
        const uint64_t b = next.fetch_add(1);
        if (batches > 0 ? b >= batches : wall.elapsed_s() >= seconds) break;
        Timer one;
        BatchOutcome o = fn(t, b);
        const double ms = one.elapsed_ms();
        std::lock_guard lock(mu);
        lat.push_back(ms);
        r.bytes += o.bytes;
        r.ops += o.ops;
        if (!o.error.ok() && r.errors++ == 0) r.first_error = o.error.to_string();
      }
    });
  }
  for (auto& t : pool) t.join();
  r.seconds = wall.elapsed_s();
  r.cpu_s = cpu_seconds() + server_cpu() - cpu0;
  r.p50_ms = percentile(lat, 0.5);
  r.p99_ms = percentile(lat, 0.99);
  r.lat_ms = std::move(lat);
  return r;
}

struct FioResult {
  Status status;
  double bw_bytes = 0, iops = 0, p50_ms = 0, p99_ms = 0;
  std::string command;
  int runs = 0;
  // Folds in another run of the same job: throughput over the summed time (equal bytes per run
  // for size-based jobs, equal time for time-based ones), the latency percentiles' mean.
  void add(const FioResult& o, bool time_based) {
    command = o.command;
    if (!status.ok()) return;
    if (!o.status.ok()) {
      status = o.status;
      return;
    }
    const double n = runs;
    if (time_based) {
      bw_bytes = (bw_bytes * n + o.bw_bytes) / (n + 1);
      iops = (iops * n + o.iops) / (n + 1);
    } else {
      bw_bytes = (n + 1) / (n / std::max(bw_bytes, 1e-9) + 1 / std::max(o.bw_bytes, 1e-9));
      iops = (n + 1) / (n / std::max(iops, 1e-9) + 1 / std::max(o.iops, 1e-9));
    }
    p50_ms = (p50_ms * n + o.p50_ms) / (n + 1);
    p99_ms = (p99_ms * n + o.p99_ms) / (n + 1);
    ++runs;
  }
  nlohmann::json to_json() const {
    return {{"ok", status.ok()},
            {"gbs", bw_bytes / 1e9},
            {"iops", iops},
            {"clat_p50_ms", p50_ms},
            {"clat_p99_ms", p99_ms},
            {"command", command},
            {"runs", runs},
            {"error", status.ok() ? "" : status.to_string()}};
  }
};

FioResult run_fio(const std::string& args, bool write) {
  FioResult r;
  r.command = "fio --output-format=json " + args;
  FILE* p = ::popen((r.command + " 2>&1").c_str(), "r");
  if (p == nullptr) {
    r.status = io_error("cannot run fio: {}", std::strerror(errno));
    return r;
  }
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  const int rc = ::pclose(p);
  const size_t brace = out.find('{');
  if (rc != 0 || brace == std::string::npos) {
    r.status = unavailable("fio failed (exit {}): {}", rc, out.substr(0, 400));
    return r;
  }
  try {
    const auto j = nlohmann::json::parse(out.substr(brace));
    const auto& side = j.at("jobs").at(0).at(write ? "write" : "read");
    r.bw_bytes = side.at("bw_bytes").get<double>();
    r.iops = side.at("iops").get<double>();
    const auto& pct = side.at("clat_ns").at("percentile");
    r.p50_ms = pct.at("50.000000").get<double>() / 1e6;
    r.p99_ms = pct.at("99.000000").get<double>() / 1e6;
  } catch (const std::exception& ex) {
    r.status = corrupt("fio output: {}", ex.what());
  }
  return r;
}

KvKey key_for(uint64_t run, uint64_t phase, uint64_t i) {
  KvKey k{};
  for (int w = 0; w < 4; ++w) {
    const uint64_t v = splitmix64(run ^ splitmix64(phase * 0x10001 + w) ^ splitmix64(i));
    std::memcpy(k.data() + 8 * w, &v, 8);
  }
  return k;
}

// One benchmark run: the data, the client and the three phases.
class StoreBench {
 public:
  StoreBench(const Options& o, uint64_t block, uint64_t total, uint64_t rand_total,
             storage::StorageClient& client, bool remote)
      : o_(o),
        bs_(block),
        batch_(static_cast<uint64_t>(o.batch)),
        threads_(static_cast<int>(o.threads)),
        n_blocks_(total / block),
        n_small_(std::max<uint64_t>(rand_total / 4096, batch_)),
        client_(client),
        kv_(client),
        remote_(remote),
        run_(splitmix64(static_cast<uint64_t>(getpid()) ^ now_ns())),
        rng_(run_) {
    // Source data: a random pool sliced at varying offsets; destinations: one buffer per thread.
    pool_.resize(std::max<size_t>(bs_ * 2, 64u << 20));
    for (size_t i = 0; i < pool_.size(); i += 8) {
      const uint64_t v = rng_.next_u64();
      std::memcpy(pool_.data() + i, &v, std::min<size_t>(8, pool_.size() - i));
    }
    dest_.assign(threads_, std::vector<uint8_t>(batch_ * bs_));
  }

  // Every block under fresh keys (the previous round's blocks are removed first, untimed).
  PhaseResult put() {
    if (put_phase_ != 0) remove_phase(put_phase_, n_blocks_);
    put_phase_ = put_phase_ == 0 ? 3 : put_phase_ + 1;
    const uint64_t n_batches = (n_blocks_ + batch_ - 1) / batch_;
    return run_phase(threads_, n_batches, 0, client_, remote_, [&](int, uint64_t b) {
      return put_blocks(put_phase_, b * batch_, std::min(batch_, n_blocks_ - b * batch_), bs_);
    });
  }

  PhaseResult get() {  // every block once, in random order
    std::vector<uint64_t> order(n_blocks_);
    for (uint64_t i = 0; i < n_blocks_; ++i) order[i] = i;
    for (uint64_t i = n_blocks_; i > 1; --i) std::swap(order[i - 1], order[rng_.below(i)]);
    const uint64_t n_batches = (n_blocks_ + batch_ - 1) / batch_;
    return run_phase(threads_, n_batches, 0, client_, remote_, [&](int t, uint64_t b) {
      std::vector<uint64_t> which(order.begin() + b * batch_,
                                  order.begin() + std::min(n_blocks_, (b + 1) * batch_));
      return get_blocks(t, which, put_phase_, bs_);
    });
  }

  void prepare_rand4k() {  // the data set of the 4 KiB phase
    for (uint64_t first = 0; first < n_small_; first += 1024) {
      (void)put_blocks(2, first, std::min<uint64_t>(1024, n_small_ - first), 4096);
    }
  }

  PhaseResult rand4k() {  // 4 KiB random reads over a data set of --rand-bytes
    std::vector<Rng> rngs;
    for (int t = 0; t < threads_; ++t) rngs.emplace_back(run_ + t + 1000003 * rand_round_);
    ++rand_round_;
    return run_phase(threads_, 0, o_.rand_seconds, client_, remote_, [&](int t, uint64_t) {
      std::vector<uint64_t> which(batch_);
      for (auto& w : which) w = rngs[t].below(n_small_);
      return get_blocks(t, which, 2, 4096);
    });
  }

  void cleanup() {
    if (put_phase_ != 0) remove_phase(put_phase_, n_blocks_);
    remove_phase(2, n_small_);
    if (!fio_file_.empty()) std::filesystem::remove(fio_file_);
  }

  // The same jobs with fio on the target's filesystem (needs the target path on this machine).
  // fio_write() lays out the file that fio_read() and fio_rand() read.
  Status fio_usable(const std::string& target) {
    if (o_.no_fio) return cancelled("--no-fio");
    if (!std::filesystem::is_directory(target)) {
      return unavailable("target path '{}' is not on this machine: run the bench on the server's host", target);
    }
    fio_file_ = fmt::format("{}/fio-bench-{}.tmp", target, getpid());
    std::fprintf(stderr, "store bench: fio on %s (queue depth %llu)\n", target.c_str(),
                 static_cast<unsigned long long>(queue_depth()));
    return {};
  }
  FioResult fio_write() const {
    return run_fio(fmt::format("{} --rw=write --bs={} --size={} --fdatasync={} --end_fsync=1", fio_common(), bs_,
                               n_blocks_ * bs_, batch_),
                   true);
  }
  FioResult fio_read() const {
    return run_fio(fmt::format("{} --rw=randread --bs={} --size={}", fio_common(), bs_, n_blocks_ * bs_), false);
  }
  FioResult fio_rand() const {
    return run_fio(fmt::format("{} --rw=randread --bs=4k --size={} --runtime={} --time_based", fio_common(),
                               n_small_ * 4096, o_.rand_seconds),
                   false);
  }

  uint64_t queue_depth() const { return static_cast<uint64_t>(threads_) * batch_; }
  uint64_t blocks() const { return n_blocks_; }

 private:
  void remove_phase(uint64_t phase, uint64_t n) {
    for (uint64_t first = 0; first < n; first += 4096) {
      std::vector<KvKey> keys;
      for (uint64_t i = first; i < std::min(n, first + 4096); ++i) keys.push_back(key_for(run_, phase, i));
      (void)kv_.remove(keys);
    }
  }

  BatchOutcome put_blocks(uint64_t phase, uint64_t first, uint64_t count, uint64_t size) {
    std::vector<KvKey> keys;
    std::vector<std::span<const uint8_t>> values;
    for (uint64_t i = first; i < first + count; ++i) {
      keys.push_back(key_for(run_, phase, i));
      values.emplace_back(pool_.data() + (i * 4099 * 4096) % (pool_.size() - size), size);
    }
    BatchOutcome out;
    for (const Status& s : kv_.batch_put(keys, values)) {
      if (s.ok()) out.bytes += size, out.ops += 1;
      if (!s.ok() && out.error.ok()) out.error = s;
    }
    return out;
  }

  BatchOutcome get_blocks(int t, const std::vector<uint64_t>& which, uint64_t phase, uint64_t size) {
    std::vector<KvKey> keys;
    std::vector<std::span<uint8_t>> spans;
    for (size_t k = 0; k < which.size(); ++k) {
      keys.push_back(key_for(run_, phase, which[k]));
      spans.emplace_back(dest_[t].data() + k * size, size);
    }
    BatchOutcome out;
    for (const auto& r : kv_.batch_get(keys, spans)) {
      if (r.status.ok() && r.length == size) out.bytes += size, out.ops += 1;
      if (!r.status.ok() && out.error.ok()) out.error = r.status;
    }
    return out;
  }

  const Options& o_;
  const uint64_t bs_, batch_;
  const int threads_;
  const uint64_t n_blocks_, n_small_;
  storage::StorageClient& client_;
  storage::KvCache kv_;
  const bool remote_;
  const uint64_t run_;
  Rng rng_;
  std::vector<uint8_t> pool_;
  std::vector<std::vector<uint8_t>> dest_;
  std::string fio_file_;
  uint64_t rand_round_ = 0;
  uint64_t put_phase_ = 0;  // key space of the blocks now stored (3, 4, ...: one per put round)

  std::string fio_common() const {
    return fmt::format("--filename={} --direct=1 --ioengine=io_uring --iodepth={} --name=job", fio_file_,
                       queue_depth());
  }
};

struct Report {
  PhaseResult put, get, rand4k;
  FioResult fio_write, fio_read, fio_rand;
  nlohmann::json rounds = nlohmann::json::array();  // per round: ours and fio's read figures
  double ratio(double a, double b) const { return b > 0 ? a / b : 0.0; }
  double put_fraction() const { return ratio(put.gbs(), fio_write.bw_bytes / 1e9); }
  double get_fraction() const { return ratio(get.gbs(), fio_read.bw_bytes / 1e9); }
  double iops_fraction() const { return ratio(rand4k.iops(), fio_rand.iops); }
  uint64_t errors() const { return put.errors + get.errors + rand4k.errors; }
};

void print_report(const Options& o, const Report& r, uint64_t bs, uint64_t qd, const std::string& target,
                  const std::string& server) {
  if (o.json) {
    nlohmann::json j = {{"block_bytes", bs},
                        {"batch", o.batch},
                        {"threads", o.threads},
                        {"queue_depth", qd},
                        {"request_split_bytes", o.split_bytes},
                        {"keep_empty_bytes", o.keep_empty_bytes},  // the in-process server's
                        {"target", target},
                        {"server", server},
                        {"put", r.put.to_json()},
                        {"get", r.get.to_json()},
                        {"rand4k_get", r.rand4k.to_json()},
                        {"fio_write", r.fio_write.to_json()},
                        {"fio_read", r.fio_read.to_json()},
                        {"fio_rand4k_read", r.fio_rand.to_json()},
                        {"get_fraction_of_fio", r.get_fraction()},
                        {"put_fraction_of_fio", r.put_fraction()},
                        {"rand4k_iops_fraction_of_fio", r.iops_fraction()},
                        {"rounds", r.rounds},
                        {"errors", r.errors()}};
    print_json_line(j.dump());
    return;
  }
  std::printf(
      "store bench: %s blocks, %lld threads x batch %lld (queue depth %llu, requests of <= %s), %zu rounds, "
      "target %s\n",
      format_bytes(bs).c_str(), static_cast<long long>(o.threads), static_cast<long long>(o.batch),
      static_cast<unsigned long long>(qd),
      o.split_bytes == 0 ? "the whole batch" : format_bytes(o.split_bytes).c_str(),
      r.rounds.size(), target.c_str());
  std::printf(
      "  put  %7.3f GB/s %8.0f IOPS  p50 %.2f ms p99 %.2f ms  %.2f cores per GB/s | fio write %.3f GB/s -> "
      "%.0f%%\n",
      r.put.gbs(), r.put.iops(), r.put.p50_ms, r.put.p99_ms, r.put.cores_per_gbs(),
      r.fio_write.bw_bytes / 1e9, 100 * r.put_fraction());
  std::printf(
      "  get  %7.3f GB/s %8.0f IOPS  p50 %.2f ms p99 %.2f ms  %.2f cores per GB/s | fio read  %.3f GB/s -> "
      "%.0f%%\n",
      r.get.gbs(), r.get.iops(), r.get.p50_ms, r.get.p99_ms, r.get.cores_per_gbs(), r.fio_read.bw_bytes / 1e9,
      100 * r.get_fraction());
  std::printf("  4K random get %8.0f IOPS  p50 %.2f ms p99 %.2f ms | fio %8.0f IOPS -> %.0f%%\n",
              r.rand4k.iops(), r.rand4k.p50_ms, r.rand4k.p99_ms, r.fio_rand.iops, 100 * r.iops_fraction());
  // Round 1 writes fresh space on both sides; later rounds reuse it (fio its file, the server the
  // groups it keeps), so the rounds show the two cases apart.
  if (r.rounds.size() > 1) {
    std::printf("  per round, GB/s ours / fio: put");
    for (const auto& x : r.rounds)
      std::printf(" %.2f/%.2f", x["put_gbs"].get<double>(), x["fio_write_gbs"].get<double>());
    std::printf(", get");
    for (const auto& x : r.rounds)
      std::printf(" %.2f/%.2f", x["get_gbs"].get<double>(), x["fio_read_gbs"].get<double>());
    std::printf("\n");
  }
  for (const FioResult* f : {&r.fio_write, &r.fio_read, &r.fio_rand}) {
    if (!f->status.ok()) std::printf("  fio: %s\n", f->status.to_string().c_str());
  }
}

int run_store_bench(int argc, char** argv) {
  Options o;
  Args args(argv[0],
            "Storage service put/get GB/s, 4 KiB random-read IOPS and latency, against fio in the same run.");
  args.multi("--server", &o.servers, "a running server (default: start one in-process on --dir)",
             "HOST:PORT");
  args.option("--dir", &o.dir, "target directory for the in-process server (default: a temporary one)",
              "DIR");
  args.option("--block-size", &o.block, "block size of the put/get phases", "SIZE");
  args.option("--batch", &o.batch, "blocks per request");
  args.option("--threads", &o.threads, "requests in flight (client threads)");
  args.option("--bytes", &o.bytes, "bytes put then read back", "SIZE");
  args.option("--rounds", &o.rounds, "rounds, each phase next to its fio job (order alternating)");
  args.option("--rand-seconds", &o.rand_seconds, "duration of each round's 4 KiB random-read phase", "S");
  args.option("--rand-bytes", &o.rand_bytes, "data set of the 4 KiB random-read phase", "SIZE");
  args.option("--request-split", &o.split,
              "the client sends a batch as requests of at most this size, in flight together (0: no split "
              "beyond the server's limits)",
              "SIZE");
  args.option("--keep-empty", &o.keep_empty,
              "the in-process server's --keep-empty (emptied slot groups kept allocated for new puts)",
              "SIZE");
  args.flag("--no-fio", &o.no_fio, "skip the fio baseline");
  args.flag("--json", &o.json, "print one JSON object");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  auto block = parse_size(o.block, "--block-size");
  auto total = parse_size(o.bytes, "--bytes");
  auto rand_total = parse_size(o.rand_bytes, "--rand-bytes");
  auto split = parse_size(o.split, "--request-split");
  auto keep = parse_size(o.keep_empty, "--keep-empty");
  for (const auto* r : {&block, &total, &rand_total, &split, &keep}) {
    if (!r->ok()) return fail(args.command(), r->status());
  }
  o.split_bytes = *split;
  o.keep_empty_bytes = *keep;
  if (*block == 0 || *block > (64u << 20) || o.batch < 1 || o.threads < 1 || *total < *block || o.rounds < 1 ||
      !(o.rand_seconds > 0)) {
    return fail(args.command(),
                invalid_argument("need 0 < --block-size <= 64M, --batch, --threads and --rounds >= 1, "
                                 "--bytes >= --block-size and --rand-seconds > 0"));
  }
  // The server: a running one, or one in this process.
  std::unique_ptr<storage::StorageServer> local;
  std::string tmp_dir;
  std::vector<std::string> servers = o.servers;
  if (servers.empty()) {
    tmp_dir = o.dir.empty()
                  ? (std::filesystem::temp_directory_path() / fmt::format("fathom-store-bench-{}", getpid()))
                        .string()
                  : o.dir;
    auto s = storage::StorageServer::start(storage::ServerParams{.targets = {storage::TargetParams{tmp_dir}},
                                                                 .listen = "127.0.0.1:0",
                                                                 .keep_empty_bytes = o.keep_empty_bytes});
    if (!s.ok()) return fail(args.command(), s.status());
    local = std::move(*s);
    servers.push_back(local->address());
  }
  auto client = storage::StorageClient::connect(
      storage::ClientParams{.servers = servers, .request_split_bytes = o.split_bytes});
  if (!client.ok()) return fail(args.command(), client.status());
  const std::string target = (*client)->targets()[0].path;
  StoreBench bench(o, *block, *total, *rand_total, **client, local == nullptr);
  std::fprintf(stderr, "store bench: %llu x %s blocks, %lld threads x batch %lld\n",
               static_cast<unsigned long long>(bench.blocks()), format_bytes(*block).c_str(),
               static_cast<long long>(o.threads), static_cast<long long>(o.batch));
  Report r;
  const Status fio_ok = bench.fio_usable(target);
  if (!fio_ok.ok()) r.fio_write.status = r.fio_read.status = r.fio_rand.status = fio_ok;
  bench.prepare_rand4k();
  // Each round pairs every phase with its fio job, alternating which runs first; a round's get
  // reads back what its put wrote.
  ProgressBar bar({.label = "store bench rounds", .total = static_cast<uint64_t>(o.rounds)});
  for (int64_t round = 0; round < o.rounds; ++round) {
    PhaseResult put, get, rand;
    FioResult fwrite, fread, frand;
    const bool fio_first = round % 2 != 0;
    auto pair = [&](auto&& ours, auto&& theirs) {
      if (fio_first && fio_ok.ok()) theirs();
      ours();
      if (!fio_first && fio_ok.ok()) theirs();
    };
    pair([&] { put = bench.put(); }, [&] { fwrite = bench.fio_write(); });
    pair([&] { get = bench.get(); }, [&] { fread = bench.fio_read(); });
    pair([&] { rand = bench.rand4k(); }, [&] { frand = bench.fio_rand(); });
    r.put.add(put);
    r.get.add(get);
    r.rand4k.add(rand);
    if (fio_ok.ok()) {
      r.fio_write.add(fwrite, false);
      r.fio_read.add(fread, false);
      r.fio_rand.add(frand, true);
    }
    r.rounds.push_back({{"put_gbs", put.gbs()},
                        {"fio_write_gbs", fwrite.bw_bytes / 1e9},
                        {"get_gbs", get.gbs()},
                        {"fio_read_gbs", fread.bw_bytes / 1e9},
                        {"rand4k_iops", rand.iops()},
                        {"fio_rand4k_iops", frand.iops},
                        {"fio_first", fio_first}});
    bar.set(static_cast<uint64_t>(round + 1));
  }
  bar.finish();
  bench.cleanup();
  if (local) local->stop();
  if (!tmp_dir.empty() && o.dir.empty()) std::filesystem::remove_all(tmp_dir);
  print_report(o, r, *block, bench.queue_depth(), target, local ? "in-process" : servers[0]);
  if (r.errors() > 0) {
    const std::string first = !r.put.first_error.empty()   ? r.put.first_error
                              : !r.get.first_error.empty() ? r.get.first_error
                                                           : r.rand4k.first_error;
    return fail(args.command(), internal_error("{} failed operations; first: {}", r.errors(), first));
  }
  return 0;
}

}  // namespace

FATHOM_BENCH("store", "Storage service put/get GB/s, 4K IOPS, latency vs fio on the same disk",
             run_store_bench);

}  // namespace fathom::cli
