// `mpirun -np 2 fathom bench pipeline`: the measured bubble of DualPipe, DualPipeV, ZB1P and 1F1B
// on the same model and micro-batch count, side by side with the simulator's prediction from the
// F/B/W times measured in the same run (and its replay of every op's own time). Each schedule runs
// a warm-up step and then --steps measured steps; figures are medians over the measured steps, so
// a noisy shared machine moves them less.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "base/fs.h"
#include "base/strings.h"
#include "base/thread_pool.h"
#include "cli/args.h"
#include "cli/bench.h"
#include "pipeline/trainer.h"

namespace fathom::cli {
namespace {

using namespace fathom::pipeline;

struct BenchOptions {
  std::string schedules = "dualpipe,dualpipev,zb1p,1f1b";
  int microbatches = 8;
  int steps = 7;
  int64_t tokens = 64, hidden = 256, ffn = 512;
  int layers = 8;
  std::string svg_dir;
  bool json = false;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Row {
  std::string name;
  int stages = 0;
  Costs costs;  // medians over measured steps
  double makespan_ms = 0, measured = 0, predicted = 0, predicted_per_rank = 0, replayed = 0;
};

// Each cost's median over steps.
Costs median_costs(const std::vector<Costs>& steps) {
  std::vector<double> f, b, w, fb, bi;
  for (const Costs& c : steps) {
    f.push_back(c.f);
    b.push_back(c.b);
    w.push_back(c.w);
    if (c.fb) fb.push_back(*c.fb);
    if (c.bi) bi.push_back(*c.bi);
  }
  Costs out{.f = median(f), .b = median(b), .w = median(w), .p2p = steps.empty() ? 0 : steps[0].p2p};
  if (!fb.empty()) out.fb = median(fb);
  if (!bi.empty()) out.bi = median(bi);
  out.w = std::min(out.w, out.b);
  return out;
}

Result<Row> bench_schedule(const BenchOptions& b, ScheduleKind kind, int n_ranks) {
  TrainOptions o;
  o.kind = kind;
  o.microbatches = b.microbatches;
  o.steps = b.steps + 1;
  const int stages = kind == ScheduleKind::kDualPipeV ? 2 * n_ranks : n_ranks;
  if (b.layers % stages != 0) {
    return invalid_argument("--layers {} does not divide into {} stages of {}", b.layers, stages,
                            schedule_name(kind));
  }
  o.model = {
      .tokens = b.tokens, .hidden = b.hidden, .ffn = b.ffn, .blocks_per_stage = b.layers / stages, .seed = 1};
  const TrainReport r = TRY(train(o, MPI_COMM_WORLD));
  Row row{.name = std::string(schedule_name(kind)), .stages = stages};
  if (r.steps.empty()) return row;  // not rank 0
  std::vector<double> measured, replayed, makespan;
  std::vector<Costs> costs;
  std::vector<std::vector<Costs>> rank_costs(static_cast<size_t>(n_ranks));
  for (size_t k = 1; k < r.steps.size(); ++k) {
    const StepMeasure& m = r.steps[k];
    measured.push_back(m.bubble_fraction);
    replayed.push_back(m.replayed_bubble_fraction);
    makespan.push_back(m.makespan_ms);
    costs.push_back(m.costs);
    for (size_t q = 0; q < rank_costs.size(); ++q) rank_costs[q].push_back(m.rank_costs[q]);
  }
  row.costs = median_costs(costs);
  std::vector<Costs> per_rank;
  for (const auto& c : rank_costs) per_rank.push_back(median_costs(c));
  row.measured = median(measured);
  row.replayed = median(replayed);
  row.makespan_ms = median(makespan);
  auto fraction = [](const Simulation& sim) { return sim.makespan > 0 ? sim.bubble / sim.makespan : 0.0; };
  row.predicted = fraction(TRY(simulate(r.schedule, row.costs)));
  row.predicted_per_rank = fraction(TRY(simulate_per_rank(r.schedule, per_rank)));
  if (!b.svg_dir.empty()) {
    TRY(make_directories(b.svg_dir));
    TRY(write_file_atomic(b.svg_dir + "/pipeline-" + row.name + ".svg", render_svg(r.timeline)));
  }
  return row;
}

void print_rows(const BenchOptions& b, int n_ranks, const std::vector<Row>& rows) {
  std::printf(
      "pipeline bench: %d ranks, %d micro-batches, %d MLP blocks (tokens %lld, hidden %lld, ffn %lld), "
      "medians of %d steps\n",
      n_ranks, b.microbatches, b.layers, static_cast<long long>(b.tokens), static_cast<long long>(b.hidden),
      static_cast<long long>(b.ffn), b.steps);
  std::printf("%-10s %6s %7s %7s %7s %7s %8s %9s %9s %9s %9s %8s\n", "schedule", "stages", "F ms", "B ms",
              "W ms", "F&B ms", "step ms", "measured", "predicted", "per-rank", "replayed", "diff pp");
  for (const Row& r : rows) {
    const std::string fb = r.costs.fb ? fmt::format("{:.2f}", *r.costs.fb) : "-";
    std::printf("%-10s %6d %7.2f %7.2f %7.2f %7s %8.1f %8.1f%% %8.1f%% %8.1f%% %8.1f%% %+8.1f\n",
                r.name.c_str(), r.stages, r.costs.f, r.costs.b, r.costs.w, fb.c_str(), r.makespan_ms,
                100 * r.measured, 100 * r.predicted, 100 * r.predicted_per_rank, 100 * r.replayed,
                100 * (r.measured - r.predicted));
  }
}

int run_bench_pipeline(int argc, char** argv) {
  BenchOptions b;
  Args args(argv[0], "Measured vs simulated bubble of pipeline schedules (run under mpirun -np 2 or more).");
  args.option("--schedules", &b.schedules, "comma-separated schedules to run", "LIST");
  args.option("--microbatches", &b.microbatches, "micro-batches per step");
  args.option("--steps", &b.steps, "measured steps per schedule (after one warm-up step)");
  args.option("--tokens", &b.tokens, "rows per micro-batch");
  args.option("--hidden", &b.hidden, "hidden size");
  args.option("--ffn", &b.ffn, "SwiGLU inner size");
  args.option("--layers", &b.layers, "MLP blocks in the whole model (split over the stages)");
  args.option("--svg-dir", &b.svg_dir, "write each schedule's last measured step as DIR/pipeline-NAME.svg",
              "DIR");
  args.flag("--json", &b.json, "print one JSON object");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  MpiSession mpi;
  if (mpi.size() < 2) {
    return fail(args.command(),
                invalid_argument("run it under MPI with 2 or more ranks: mpirun -np 2 fathom bench "
                                 "pipeline"));
  }
  if (b.steps < 1) return fail(args.command(), invalid_argument("--steps must be >= 1, got {}", b.steps));
  if (!args.given("--threads") && std::getenv("FATHOM_THREADS") == nullptr) {
    set_default_pool_threads(threads_per_local_rank(MPI_COMM_WORLD));
  }
  std::vector<Row> rows;
  for (std::string_view name : split(b.schedules, ',')) {
    auto kind = parse_schedule_kind(trim(name));
    if (!kind.ok()) return fail(args.command(), kind.status());
    auto row = bench_schedule(b, *kind, mpi.size());
    if (!row.ok()) return fail(args.command(), row.status());
    rows.push_back(*row);
  }
  if (mpi.rank() != 0) return 0;
  if (!b.json) {
    print_rows(b, mpi.size(), rows);
    return 0;
  }
  nlohmann::json list = nlohmann::json::array();
  for (const Row& r : rows) {
    nlohmann::json costs = {{"f", r.costs.f}, {"b", r.costs.b}, {"w", r.costs.w}, {"p2p", r.costs.p2p}};
    if (r.costs.fb) costs["fb"] = *r.costs.fb;
    if (r.costs.bi) costs["bi"] = *r.costs.bi;
    list.push_back({{"schedule", r.name},
                    {"stages", r.stages},
                    {"costs_ms", costs},
                    {"step_ms", r.makespan_ms},
                    {"bubble_measured", r.measured},
                    {"bubble_predicted", r.predicted},
                    {"bubble_predicted_per_rank", r.predicted_per_rank},
                    {"bubble_replayed", r.replayed},
                    {"diff_pp", 100 * (r.measured - r.predicted)},
                    {"within_5pp", std::abs(r.measured - r.predicted) <= 0.05}});
  }
  print_json_line(nlohmann::json{
      {"ranks", mpi.size()},
      {"threads_per_rank", default_pool().size()},
      {"microbatches", b.microbatches},
      {"layers", b.layers},
      {"tokens", b.tokens},
      {"hidden", b.hidden},
      {"ffn", b.ffn},
      {"steps", b.steps},
      {"schedules",
       list}}.dump());
  return 0;
}

}  // namespace

FATHOM_BENCH("pipeline", "Measured vs simulated bubble of DualPipe, DualPipeV, ZB1P, 1F1B (under mpirun)",
             run_bench_pipeline);

}  // namespace fathom::cli
