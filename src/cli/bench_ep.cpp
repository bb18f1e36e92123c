// `mpirun -np N fathom bench ep`: expert-parallel dispatch and combine (normal or low-latency
// mode) against the same routing through MPI_Alltoallv (pack, counts exchange, Alltoallv,
// unpack), in one run, with this machine's copy bandwidth measured first. Reports per phase:
// latency p50/p99 of the slowest rank, DeepEP's algorithmic bandwidth (received rows x hidden x
// bytes per value), the memory bytes the phase must move and their rate against the copy
// bandwidth, and speedup_vs_alltoallv. Outputs of both paths are compared bit for bit once.
#include <mpi.h>
#include <sched.h>
#include <time.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "base/rng.h"
#include "base/strings.h"
#include "base/thread_pool.h"
#include "base/timer.h"
#include "cli/args.h"
#include "cli/bench.h"
#include "ep/ep.h"
#include "kernels/roofline.h"
#include "tensor/convert.h"

namespace fathom::cli {
namespace {

struct EpBenchOptions {
  int64_t tokens = -1;  // -1: 4096 (normal) or 128 (low latency)
  int64_t hidden = 7168;
  int topk = 8;
  int experts = 256;
  std::string mode = "normal";
  std::string format;  // default: bf16 (normal), fp8 (low latency), as in DeepEP's figures
  std::string combine_format = "bf16";
  int iters = 20;
  int warmup = 3;
  int ranks_per_node = 0;
  bool hierarchical = false;
  bool no_direct = false;
  std::string bw_bytes = "256M";
  int64_t seed = 1;
  bool json = false;
};

// Waits at a barrier without spinning, so a rank measuring the machine has the cores to itself.
void quiet_barrier() {
  MPI_Request req;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  int done = 0;
  while (!done) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (!done) {
      timespec ts{0, 500000};
      nanosleep(&ts, nullptr);
    }
  }
}

struct Samples {
  std::vector<double> dispatch, combine;  // seconds, slowest rank per iteration
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5))];
}

void slowest_rank(std::vector<double>& v) {
  MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
}

// Routing as in DeepEP's tests: |randn| + 1 scores, top-k distinct experts, random weights.
void make_routing(Rng& rng, int64_t tokens, int topk, int experts, std::vector<int32_t>& idx,
                  std::vector<float>& w) {
  idx.assign(static_cast<size_t>(tokens * topk), -1);
  w.assign(static_cast<size_t>(tokens * topk), 0.0f);
  std::vector<int32_t> perm(static_cast<size_t>(experts));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int e = 0; e < experts; ++e) perm[static_cast<size_t>(e)] = e;
    for (int k = 0; k < topk; ++k) {  // partial Fisher-Yates: k distinct uniform experts
      const size_t j =
          static_cast<size_t>(k) + static_cast<size_t>(rng.below(static_cast<uint64_t>(experts - k)));
      std::swap(perm[static_cast<size_t>(k)], perm[j]);
      idx[static_cast<size_t>(t * topk + k)] = perm[static_cast<size_t>(k)];
      w[static_cast<size_t>(t * topk + k)] = rng.uniform_f(0.1f, 1.0f);
    }
  }
}

struct Setup {
  EpBenchOptions o;
  ep::EpOptions eo;
  ep::WireFormat format, combine;
  int rank = 0, ranks = 1;
  bool ll = false;
  std::vector<uint16_t> x;  // [tokens, hidden] bf16 (or f32 bits when format is f32)
  std::vector<float> xf;
  std::vector<int32_t> idx;
  std::vector<float> w;
  ep::DispatchInput input() {
    Tensor t = format == ep::WireFormat::kF32
                   ? Tensor::contiguous(DType::kF32, {o.tokens, o.hidden}, xf.data())
                   : Tensor::contiguous(DType::kBF16, {o.tokens, o.hidden}, x.data());
    return ep::DispatchInput{t, idx.data(), w.data(), format};
  }
};

// Expert outputs (not timed): the received rows themselves, written where combine reads them.
void fill_normal_outputs(const ep::DispatchOutput& out, Tensor dst) {
  const int64_t n = out.x.dim(0), h = dst.cols();
  const uint64_t rb = dst.row_bytes();
  for (int64_t i = 0; i < n; ++i) {
    uint8_t* d = static_cast<uint8_t*>(dst.data) + static_cast<uint64_t>(i) * rb;
    if (out.x.dtype == dst.dtype)
      std::memcpy(d, out.x.row_ptr(i), rb);
    else
      std::memset(d, 0, rb);  // FP8 in, bf16 out: content does not matter for timing
    (void)h;
  }
}

Status run_normal(Setup& s, ep::EpGroup& g, ep::AlltoallvBaseline& base, Samples& ours, Samples& theirs,
                  bool* verified, double* recv_rows) {
  ep::EpHandle h = g.new_handle();
  const int64_t H = s.o.hidden;
  std::vector<float> out_a(static_cast<size_t>(s.o.tokens * H)), out_b(out_a.size());
  const DType cdt = s.combine == ep::WireFormat::kF32 ? DType::kF32 : DType::kBF16;
  std::vector<uint8_t> base_in(static_cast<size_t>(g.options().max_recv_tokens > 0
                                                       ? g.options().max_recv_tokens
                                                       : s.o.tokens * s.ranks) *
                               static_cast<size_t>(H) * (cdt == DType::kF32 ? 4 : 2));
  const int total = s.o.warmup + s.o.iters;
  for (int it = 0; it < total; ++it) {
    ep::DispatchOutput out;
    quiet_barrier();
    MPI_Barrier(MPI_COMM_WORLD);  // the quiet barrier lets ranks go up to its sleep apart: start together
    Timer t0;
    TRY(g.dispatch(s.input(), &h, &out));
    const double d = t0.elapsed_s();
    if (std::getenv("FATHOM_EP_BENCH_TRACE")) {
      const ep::PhaseTimes& pt = g.last_times();
      std::fprintf(stderr, "rank %d dispatch %.1f us: layout %.1f sync %.1f copy %.1f wait %.1f\n", s.rank,
                   d * 1e6, pt.layout_s * 1e6, pt.sync_s * 1e6, pt.copy_s * 1e6, pt.wait_s * 1e6);
    }
    Tensor cin = g.combine_buffer(h, H);
    fill_normal_outputs(out, cin);
    *recv_rows = static_cast<double>(out.x.dim(0));
    MPI_Barrier(MPI_COMM_WORLD);
    Timer t1;
    TRY(g.combine(cin, h, Tensor::contiguous(DType::kF32, {s.o.tokens, H}, out_a.data())));
    const double c = t1.elapsed_s();
    if (std::getenv("FATHOM_EP_BENCH_TRACE")) {
      const ep::PhaseTimes& pt = g.last_times();
      std::fprintf(stderr, "rank %d combine %.1f us: sync %.1f copy %.1f wait %.1f\n", s.rank, c * 1e6,
                   pt.sync_s * 1e6, pt.copy_s * 1e6, pt.wait_s * 1e6);
    }
    ep::DispatchOutput ref;
    MPI_Barrier(MPI_COMM_WORLD);
    Timer t2;
    TRY(base.dispatch(s.input(), &ref));
    const double bd = t2.elapsed_s();
    Tensor bin = Tensor::contiguous(cdt, {ref.x.dim(0), H}, base_in.data());
    fill_normal_outputs(ref, bin);
    MPI_Barrier(MPI_COMM_WORLD);
    Timer t3;
    TRY(base.combine(bin, Tensor::contiguous(DType::kF32, {s.o.tokens, H}, out_b.data())));
    const double bc = t3.elapsed_s();
    if (it == 0)
      *verified =
          out.x.dim(0) == ref.x.dim(0) &&
          std::memcmp(out.x.data, ref.x.data, static_cast<size_t>(out.x.nbytes())) == 0 &&
          (g.options().hierarchical || std::memcmp(out_a.data(), out_b.data(), out_a.size() * 4) == 0);
    if (it < s.o.warmup) continue;
    ours.dispatch.push_back(d), ours.combine.push_back(c), theirs.dispatch.push_back(bd),
        theirs.combine.push_back(bc);
  }
  return {};
}

Status run_low_latency(Setup& s, ep::EpGroup& g, ep::AlltoallvBaseline& base, Samples& ours, Samples& theirs,
                       bool* verified, double* recv_rows) {
  const int64_t H = s.o.hidden;
  std::vector<float> out_a(static_cast<size_t>(s.o.tokens * H)), out_b(out_a.size());
  const DType cdt = s.combine == ep::WireFormat::kF32 ? DType::kF32 : DType::kBF16;
  const int L = g.local_experts();
  const int64_t slots = static_cast<int64_t>(s.ranks) * s.o.tokens;
  std::vector<uint8_t> base_in(static_cast<size_t>(L * slots * H) * (cdt == DType::kF32 ? 4 : 2), 0);
  const int total = s.o.warmup + s.o.iters;
  for (int it = 0; it < total; ++it) {
    ep::LowLatencyOutput out, ref;
    quiet_barrier();
    MPI_Barrier(MPI_COMM_WORLD);  // the quiet barrier lets ranks go up to its sleep apart: start together
    Timer t0;
    TRY(g.ll_dispatch_send(s.input()));
    const double d_send = t0.elapsed_s();
    TRY(g.ll_dispatch_recv(&out));
    const double d = t0.elapsed_s();
    if (std::getenv("FATHOM_EP_BENCH_TRACE")) {
      const ep::PhaseTimes& pt = g.last_times();
      std::fprintf(stderr, "rank %d ll dispatch %.1f us: send %.1f, recv wait %.1f copy %.1f\n", s.rank,
                   d * 1e6, d_send * 1e6, pt.wait_s * 1e6, pt.copy_s * 1e6);
    }
    double rows = 0;
    for (int32_t c : out.count) rows += c;
    *recv_rows = rows;
    Tensor cin = g.ll_combine_buffer(H);  // expert outputs are written here (not timed)
    MPI_Barrier(MPI_COMM_WORLD);
    Timer t1;
    TRY(g.ll_combine(cin, s.w.data(), Tensor::contiguous(DType::kF32, {s.o.tokens, H}, out_a.data())));
    const double c = t1.elapsed_s();
    MPI_Barrier(MPI_COMM_WORLD);
    Timer t2;
    TRY(base.dispatch_ll(s.input(), &ref));
    const double bd = t2.elapsed_s();
    MPI_Barrier(MPI_COMM_WORLD);
    Timer t3;
    TRY(base.combine_ll(Tensor::contiguous(cdt, {L, slots, H}, base_in.data()), s.w.data(),
                        Tensor::contiguous(DType::kF32, {s.o.tokens, H}, out_b.data())));
    const double bc = t3.elapsed_s();
    if (it == 0) {
      bool same = true;
      const uint64_t rb = out.x.row_bytes();
      for (int e = 0; e < L; ++e)
        same &= out.count[static_cast<size_t>(e)] == ref.count[static_cast<size_t>(e)] &&
                std::memcmp(out.x.ptr<uint8_t>() + e * slots * rb, ref.x.ptr<uint8_t>() + e * slots * rb,
                            static_cast<size_t>(out.count[static_cast<size_t>(e)]) * rb) == 0;
      *verified = same;
    }
    if (it < s.o.warmup) continue;
    ours.dispatch.push_back(d), ours.combine.push_back(c), theirs.dispatch.push_back(bd),
        theirs.combine.push_back(bc);
  }
  return {};
}

}  // namespace
}  // namespace fathom::cli

namespace fathom::cli {
namespace {

struct PhaseReport {
  double p50_us = 0, p99_us = 0, base_p50_us = 0, base_p99_us = 0, algo_gbs = 0, mem_bytes = 0, mem_gbs = 0,
         frac_copy = 0, speedup = 0;
  nlohmann::json json() const {
    return {{"p50_us", p50_us},
            {"p99_us", p99_us},
            {"alltoallv_p50_us", base_p50_us},
            {"alltoallv_p99_us", base_p99_us},
            {"algo_gbs_per_rank", algo_gbs},
            {"mem_bytes_per_rank", mem_bytes},
            {"mem_gbs", mem_gbs},
            {"fraction_of_copy_bw", frac_copy},
            {"speedup_vs_alltoallv", speedup}};
  }
};

PhaseReport report(std::vector<double> ours, std::vector<double> theirs, double algo_bytes, double mem_bytes,
                   int ranks, double copy_gbs) {
  slowest_rank(ours);
  slowest_rank(theirs);
  PhaseReport r;
  r.p50_us = percentile(ours, 0.5) * 1e6, r.p99_us = percentile(ours, 0.99) * 1e6;
  r.base_p50_us = percentile(theirs, 0.5) * 1e6, r.base_p99_us = percentile(theirs, 0.99) * 1e6;
  r.algo_gbs = algo_bytes / (r.p50_us * 1e-6) * 1e-9;
  r.mem_bytes = mem_bytes;
  r.mem_gbs = mem_bytes * ranks / (r.p50_us * 1e-6) * 1e-9;  // all ranks move memory at once
  r.frac_copy = copy_gbs > 0 ? r.mem_gbs / copy_gbs : 0;
  r.speedup = r.p50_us > 0 ? r.base_p50_us / r.p50_us : 0;
  return r;
}

double mean_over_ranks(double v) {
  double sum = 0;
  int n = 1;
  MPI_Allreduce(&v, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return sum / n;
}

Status parse_setup(Setup& s, const Args& args) {
  EpBenchOptions& o = s.o;
  if (o.mode != "normal" && o.mode != "low-latency")
    return invalid_argument("--mode must be normal or low-latency, got '{}'", o.mode);
  s.ll = o.mode == "low-latency";
  if (o.tokens < 0) o.tokens = s.ll ? 128 : 4096;
  if (o.format.empty()) o.format = s.ll ? "fp8" : "bf16";
  s.format = TRY(ep::parse_wire_format(o.format));
  s.combine = TRY(ep::parse_wire_format(o.combine_format));
  if (o.iters < 1 || o.warmup < 0) return invalid_argument("--iters must be >= 1 and --warmup >= 0");
  s.eo.max_tokens_per_rank = std::max<int64_t>(o.tokens, 1);
  s.eo.hidden = o.hidden;
  s.eo.topk = o.topk;
  s.eo.num_experts = o.experts;
  s.eo.max_dispatch_format = s.format == ep::WireFormat::kF32 ? ep::WireFormat::kF32 : ep::WireFormat::kBF16;
  s.eo.combine_format = s.combine;
  s.eo.normal_mode = !s.ll;
  s.eo.low_latency_mode = s.ll;
  s.eo.ranks_per_node = o.ranks_per_node;
  s.eo.hierarchical = o.hierarchical;
  s.eo.ll_direct_write = !o.no_direct;
  (void)args;
  return {};
}

void make_inputs(Setup& s) {
  Rng rng(static_cast<uint64_t>(s.o.seed) * 1000003 + static_cast<uint64_t>(s.rank));
  const size_t n = static_cast<size_t>(s.o.tokens * s.o.hidden);
  if (s.format == ep::WireFormat::kF32) {
    s.xf.resize(n);
    for (auto& v : s.xf) v = static_cast<float>(rng.normal());
  } else {
    s.x.resize(n);
    for (auto& v : s.x) v = f32_to_bf16(static_cast<float>(rng.normal()));
  }
  make_routing(rng, s.o.tokens, s.o.topk, s.o.experts, s.idx, s.w);
}

void print_text(const Setup& s, const PhaseReport& d, const PhaseReport& c, const PhaseReport& t,
                double copy_gbs, bool verified) {
  std::printf(
      "ep %s: %d ranks, %lld tokens/rank, hidden %lld, top-%d of %d experts, dispatch %s, combine %s\n",
      s.o.mode.c_str(), s.ranks, static_cast<long long>(s.o.tokens), static_cast<long long>(s.o.hidden),
      s.o.topk, s.o.experts, s.o.format.c_str(), s.o.combine_format.c_str());
  std::printf("machine copy bandwidth %.1f GB/s (read+write)\n", copy_gbs);
  for (auto [name, r] :
       {std::pair<const char*, const PhaseReport*>{"dispatch", &d}, {"combine", &c}, {"total", &t}})
    std::printf(
        "%-9s p50 %9.1f us  p99 %9.1f us | alltoallv p50 %9.1f us | %.2fx | algo %.2f GB/s/rank | "
        "memory %.2f GB/s = %.0f%% of copy\n",
        name, r->p50_us, r->p99_us, r->base_p50_us, r->speedup, r->algo_gbs, r->mem_gbs, 100 * r->frac_copy);
  std::printf("outputs equal MPI_Alltoallv's bit for bit: %s\n", verified ? "yes" : "NO");
}

int run_ep_bench(int argc, char** argv) {
  Setup s;
  EpBenchOptions& o = s.o;
  Args args(argv[0], "Expert-parallel dispatch/combine vs MPI_Alltoallv; run under mpirun -np N.");
  args.option("--tokens", &o.tokens, "tokens per rank (default 4096 normal, 128 low-latency)");
  args.option("--hidden", &o.hidden, "values per token");
  args.option("--topk", &o.topk, "experts per token");
  args.option("--experts", &o.experts, "routed experts (a multiple of the ranks)");
  args.option("--mode", &o.mode, "normal|low-latency", "MODE");
  args.option("--format", &o.format,
              "dispatch wire format f32|bf16|fp8 (default bf16 normal, fp8 low-latency)", "FMT");
  args.option("--combine-format", &o.combine_format, "combine wire format f32|bf16", "FMT");
  args.option("--iters", &o.iters, "timed iterations");
  args.option("--warmup", &o.warmup, "untimed iterations first");
  args.option("--ranks-per-node", &o.ranks_per_node,
              "0: ranks sharing memory; k: nodes of k ranks (1: all MPI)");
  args.flag("--hierarchical", &o.hierarchical,
            "inter-node: one copy per destination node, fan out in the node");
  args.flag("--no-direct", &o.no_direct,
            "low-latency: receivers copy every row from the senders' staging (no direct writes)");
  args.option("--bw-bytes", &o.bw_bytes, "buffer swept to measure copy bandwidth", "SIZE");
  args.option("--seed", &o.seed, "routing and data seed");
  args.flag("--json", &o.json, "print one JSON object");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  if (Status st = parse_setup(s, args); !st.ok()) return fail(args.command(), st);
  auto bw_bytes = parse_size(o.bw_bytes, "--bw-bytes");
  if (!bw_bytes.ok()) return fail(args.command(), bw_bytes.status());
  if (Status st = ep::init_mpi(&argc, &argv); !st.ok()) return fail(args.command(), st);
  MPI_Comm_rank(MPI_COMM_WORLD, &s.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &s.ranks);
  const int hw = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  if (!args.given("--threads") && std::getenv("FATHOM_THREADS") == nullptr) {
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    set_default_pool_threads(std::max(1, hw / std::max(1, local ? std::atoi(local) : 1)));
  }
  double bw[2] = {0, 0};
  if (s.rank == 0) {  // the others sleep at the barrier meanwhile
    auto pool = ThreadPool::create(hw);
    const MemoryBandwidth m = measure_memory_bandwidth(*pool, *bw_bytes, 2);
    bw[0] = m.copy_gbs, bw[1] = m.read_gbs;
  }
  quiet_barrier();
  MPI_Bcast(bw, 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  make_inputs(s);
  auto group = ep::EpGroup::create(MPI_COMM_WORLD, s.eo);
  if (!group.ok()) return fail(args.command(), group.status());
  auto base = ep::AlltoallvBaseline::create(MPI_COMM_WORLD, s.eo);
  if (!base.ok()) return fail(args.command(), base.status());
  Samples ours, theirs;
  bool verified = false;
  double rows = 0;
  Status st = s.ll ? run_low_latency(s, **group, **base, ours, theirs, &verified, &rows)
                   : run_normal(s, **group, **base, ours, theirs, &verified, &rows);
  if (!st.ok()) return fail(args.command(), st);
  int all_verified = verified ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &all_verified, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  // Bytes per rank: what DeepEP counts (received rows x row bytes) and what memory must move.
  const double H = static_cast<double>(o.hidden), mean_rows = mean_over_ranks(rows),
               T = static_cast<double>(o.tokens);
  const double wire =
      static_cast<double>(ep::wire_row_bytes(s.format, o.hidden)) +
      (s.format == ep::WireFormat::kFP8 ? 4.0 * static_cast<double>(ep::fp8_scale_cols(o.hidden)) : 0);
  const double src = H * (s.format == ep::WireFormat::kF32 ? 4 : 2),
               comb = static_cast<double>(ep::wire_row_bytes(s.combine, o.hidden));
  // Low latency: the tokens read and encoded into the sender's staging, and every received row
  // written once into its slot (by its sender, which streams it as it encodes; a receiver copying
  // from a staging would also read it, which this model does not count).
  const double d_mem = s.ll ? T * (src + wire) + mean_rows * wire : T * src + mean_rows * wire;
  const double c_mem = mean_rows * comb + T * H * 4;
  std::vector<double> tot(ours.dispatch.size()), btot(tot.size());
  for (size_t i = 0; i < tot.size(); ++i)
    tot[i] = ours.dispatch[i] + ours.combine[i], btot[i] = theirs.dispatch[i] + theirs.combine[i];
  const PhaseReport d = report(ours.dispatch, theirs.dispatch, mean_rows * wire, d_mem, s.ranks, bw[0]);
  const PhaseReport c = report(ours.combine, theirs.combine, mean_rows * comb, c_mem, s.ranks, bw[0]);
  const PhaseReport t = report(tot, btot, mean_rows * (wire + comb), d_mem + c_mem, s.ranks, bw[0]);
  if (o.json) {
    nlohmann::json j = {{"bench", "ep"},
                        {"mode", o.mode},
                        {"ranks", s.ranks},
                        {"nodes", (*group)->num_nodes()},
                        {"hierarchical", o.hierarchical},
                        {"direct_writes", !o.no_direct},
                        {"tokens_per_rank", o.tokens},
                        {"hidden", o.hidden},
                        {"topk", o.topk},
                        {"experts", o.experts},
                        {"format", o.format},
                        {"combine_format", o.combine_format},
                        {"threads_per_rank", default_pool().size()},
                        {"iters", o.iters},
                        {"recv_rows_per_rank", mean_rows},
                        {"copy_gbs", bw[0]},
                        {"read_gbs", bw[1]},
                        {"dispatch", d.json()},
                        {"combine", c.json()},
                        {"total", t.json()},
                        {"speedup_vs_alltoallv", t.speedup},
                        {"verified", all_verified == 1}};
    print_json_line(j.dump());
  } else if (s.rank == 0) {
    print_text(s, d, c, t, bw[0], all_verified == 1);
  }
  return all_verified == 1 ? 0 : fail(args.command(), internal_error("outputs differ from MPI_Alltoallv's"));
}

}  // namespace

FATHOM_BENCH("ep", "Expert-parallel dispatch/combine vs MPI_Alltoallv (under mpirun)", run_ep_bench);

}  // namespace fathom::cli
