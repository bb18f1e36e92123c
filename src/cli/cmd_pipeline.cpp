// `fathom pipeline simulate|show|train`: pipeline-parallel schedules. simulate prints the timing
// of a schedule under given op costs; show draws it (text grid, Chrome trace, SVG); train runs it
// for real under mpirun on the MLP+RMSNorm stage model (pipeline/executor.h).
#include <mpi.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/fs.h"
#include "base/thread_pool.h"
#include "cli/args.h"
#include "cli/command.h"
#include "pipeline/pipeline.h"
#include "pipeline/trainer.h"

namespace fathom::cli {

int run_pipeline_train_deepseek(int argc, char** argv);  // train_pipelined_cli.cpp

namespace {

using namespace fathom::pipeline;

struct SimulateOptions {
  std::string schedule = "dualpipe";
  int pp = 8;
  int microbatches = 20;
  double cost_f = 1, cost_b = 2, cost_w = 1, p2p = 0;
  std::optional<double> cost_fb;
  std::string trace, svg;
  double cell = 0;
  bool json = false;
};

void add_schedule_options(Args& args, SimulateOptions& o) {
  args.option("--schedule", &o.schedule, "gpipe|1f1b|zb1p|dualpipe|dualpipev", "NAME");
  args.option("--pp", &o.pp, "pipeline ranks (DualPipeV runs 2x as many stages)");
  args.option("--microbatches", &o.microbatches, "micro-batches per step (both directions together)");
  args.option("--cost-f", &o.cost_f, "forward time F");
  args.option("--cost-b", &o.cost_b, "full backward time B (input + weight gradients)");
  args.option("--cost-w", &o.cost_w, "weight-gradient part W of B");
  args.option("--cost-fb", &o.cost_fb, "overlapped forward+backward pair F&B (default F+B)");
  args.option("--p2p", &o.p2p, "latency from a send until the receiver can use the data");
}

struct Simulated {
  Schedule schedule;
  Simulation sim;
  Costs costs;
};

Result<Simulated> run_simulation(const SimulateOptions& o) {
  const ScheduleKind kind = TRY(parse_schedule_kind(o.schedule));
  Schedule s = TRY(make_schedule({.kind = kind, .n_ranks = o.pp, .n_microbatches = o.microbatches}));
  const Costs costs{.f = o.cost_f, .b = o.cost_b, .w = o.cost_w, .fb = o.cost_fb, .p2p = o.p2p};
  Simulation sim = TRY(simulate(s, costs));
  return Simulated{std::move(s), std::move(sim), costs};
}

std::string title_of(const Simulated& r) {
  const Schedule& s = r.schedule;
  return fmt::format(
      "{} (simulated): {} ranks, {} stages, {} micro-batches; F={:g} B={:g} W={:g} F&B={:g} p2p={:g}",
      schedule_name(s.params.kind), s.params.n_ranks, s.n_stages, s.params.n_microbatches, r.costs.f,
      r.costs.b, r.costs.w, r.costs.fb_cost(), r.costs.p2p);
}

nlohmann::json simulation_json(const Simulated& r) {
  const Simulation& sim = r.sim;
  return {{"schedule", schedule_name(r.schedule.params.kind)},
          {"pp", r.schedule.params.n_ranks},
          {"stages", r.schedule.n_stages},
          {"microbatches", r.schedule.params.n_microbatches},
          {"makespan", sim.makespan},
          {"busy", sim.busy},
          {"idle", sim.idle},
          {"bubble", sim.bubble},
          {"bubble_fraction", sim.makespan > 0 ? sim.bubble / sim.makespan : 0.0},
          {"peak_activations", sim.peak_activations}};
}

void print_simulation(const Simulated& r) {
  const Simulation& sim = r.sim;
  std::printf("%s\n", title_of(r).c_str());
  std::printf("makespan %g, bubble (max idle) %g = %.1f%% of the makespan\n", sim.makespan, sim.bubble,
              sim.makespan > 0 ? 100.0 * sim.bubble / sim.makespan : 0.0);
  std::printf("rank   busy      idle      peak activations\n");
  for (size_t i = 0; i < sim.idle.size(); ++i) {
    std::printf("%-6zu %-9g %-9g %d\n", i, sim.busy[i], sim.idle[i], sim.peak_activations[i]);
  }
}

Status write_pictures(const Timeline& t, const std::string& trace, const std::string& svg) {
  if (!trace.empty()) TRY(write_file_atomic(trace, render_chrome_trace(t)));
  if (!svg.empty()) TRY(write_file_atomic(svg, render_svg(t)));
  return {};
}

int run_simulate(int argc, char** argv) {
  SimulateOptions o;
  Args args(argv[0], "Simulate a pipeline schedule: makespan, per-rank idle, bubble and peak activations.");
  add_schedule_options(args, o);
  args.flag("--json", &o.json, "print one JSON object");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  auto r = run_simulation(o);
  if (!r.ok()) return fail(args.command(), r.status());
  if (o.json) {
    print_json_line(simulation_json(*r).dump());
  } else {
    print_simulation(*r);
  }
  return 0;
}

int run_show(int argc, char** argv) {
  SimulateOptions o;
  Args args(argv[0], "Draw a simulated pipeline schedule: text grid, Chrome trace JSON, SVG.");
  add_schedule_options(args, o);
  args.option("--trace", &o.trace, "write a Chrome trace JSON (chrome://tracing, Perfetto) here", "FILE");
  args.option("--svg", &o.svg, "write an SVG timeline here", "FILE");
  args.option("--cell", &o.cell, "time per grid cell (0: the shortest op)");
  args.flag("--json", &o.json, "print one JSON object (the simulate figures)");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  auto r = run_simulation(o);
  if (!r.ok()) return fail(args.command(), r.status());
  const Timeline t = timeline_from_simulation(r->schedule, r->sim, title_of(*r));
  if (Status st = write_pictures(t, o.trace, o.svg); !st.ok()) return fail(args.command(), st);
  if (o.json) {
    print_json_line(simulation_json(*r).dump());
  } else {
    std::printf("%s", render_grid(t, o.cell).c_str());
  }
  return 0;
}

struct TrainCliOptions {
  std::string schedule = "dualpipe";
  int microbatches = 0;
  int steps = 3;
  std::string dtype = "f32";
  int64_t tokens = 16, hidden = 64, ffn = 128;
  int layers = 0;
  double lr = 1e-3;
  int64_t seed = 1;
  double delay_ms = 0;
  bool verify = false, grid = false, json = false;
  std::string fault;
  std::string trace, svg;
};

Result<TrainOptions> to_train_options(const TrainCliOptions& c, int n_ranks) {
  TrainOptions o;
  o.kind = TRY(parse_schedule_kind(c.schedule));
  o.microbatches = c.microbatches > 0 ? c.microbatches : 4 * n_ranks;
  o.steps = c.steps;
  if (c.dtype != "f32" && c.dtype != "f64")
    return invalid_argument("--dtype must be f32 or f64, got '{}'", c.dtype);
  o.f64 = c.dtype == "f64";
  const int stages = o.kind == ScheduleKind::kDualPipeV ? 2 * n_ranks : n_ranks;
  const int layers = c.layers > 0 ? c.layers : stages;
  if (layers % stages != 0) {
    return invalid_argument("--layers {} does not divide into {} stages ({} on {} ranks)", layers, stages,
                            c.schedule, n_ranks);
  }
  o.model = {.tokens = c.tokens,
             .hidden = c.hidden,
             .ffn = c.ffn,
             .blocks_per_stage = layers / stages,
             .seed = uint64_t(c.seed)};
  if (!(c.lr > 0)) return invalid_argument("--lr must be positive, got {}", c.lr);
  o.adamw.lr = c.lr;
  if (c.delay_ms < 0) return invalid_argument("--delay-ms must be >= 0, got {}", c.delay_ms);
  o.delay_ms_max = c.delay_ms;
  o.verify = c.verify;
  if (c.fault == "drop-weight-grad") {
    o.fault = ExecutorOptions::Fault::kDropWeightGradient;
  } else if (c.fault == "corrupt-activation") {
    o.fault = ExecutorOptions::Fault::kCorruptActivation;
  } else if (!c.fault.empty()) {
    return invalid_argument("--inject-fault must be drop-weight-grad or corrupt-activation, got '{}'",
                            c.fault);
  }
  return o;
}

nlohmann::json costs_json(const Costs& c) {
  nlohmann::json j = {{"f", c.f}, {"b", c.b}, {"w", c.w}, {"p2p", c.p2p}};
  if (c.fb) j["fb"] = *c.fb;
  if (c.bi) j["bi"] = *c.bi;
  return j;
}

nlohmann::json train_json(const TrainOptions& o, const TrainReport& r) {
  nlohmann::json steps = nlohmann::json::array();
  for (const StepMeasure& m : r.steps) {
    steps.push_back({{"makespan_ms", m.makespan_ms},
                     {"busy_ms", m.busy_ms},
                     {"idle_ms", m.idle_ms},
                     {"bubble_ms", m.bubble_ms},
                     {"bubble_fraction", m.bubble_fraction},
                     {"predicted_makespan_ms", m.predicted_makespan},
                     {"predicted_bubble_fraction", m.predicted_bubble_fraction},
                     {"predicted_rank_bubble_fraction", m.predicted_rank_bubble_fraction},
                     {"replayed_bubble_fraction", m.replayed_bubble_fraction},
                     {"sync_ms", m.sync_ms},
                     {"costs_ms", costs_json(m.costs)}});
  }
  nlohmann::json j = {{"schedule", schedule_name(o.kind)},
                      {"ranks", r.schedule.params.n_ranks},
                      {"stages", r.schedule.n_stages},
                      {"microbatches", o.microbatches},
                      {"steps", o.steps},
                      {"dtype", o.f64 ? "f64" : "f32"},
                      {"parameters_per_stage", r.parameters_per_stage},
                      {"losses", r.losses},
                      {"params_digest", r.params_digest},
                      {"p2p_ms", r.p2p_ms},
                      {"measured", steps}};
  if (r.verification) {
    const Verification& v = *r.verification;
    j["verify"] = {{"passed", v.passed()},
                   {"bound", v.bound},
                   {"first_step_losses_identical", v.first_step_losses_identical},
                   {"later_loss_rel_err", v.later_loss_rel_err},
                   {"grad_rel_err", v.grad_rel_err},
                   {"param_rel_err", v.param_rel_err},
                   {"replicas_identical", v.replicas_identical}};
  }
  return j;
}

void print_train(const TrainOptions& o, const TrainReport& r) {
  const Schedule& s = r.schedule;
  std::printf("%s: %d ranks, %d stages x %d blocks, %d micro-batches, %s, %lld parameters per stage\n",
              std::string(schedule_name(o.kind)).c_str(), s.params.n_ranks, s.n_stages,
              o.model.blocks_per_stage, o.microbatches, o.f64 ? "f64" : "f32",
              static_cast<long long>(r.parameters_per_stage));
  for (size_t k = 0; k < r.steps.size(); ++k) {
    double mean = 0;
    for (double l : r.losses[k]) mean += l / double(r.losses[k].size());
    const StepMeasure& m = r.steps[k];
    std::printf(
        "step %zu: loss %.6f, %.1f ms, bubble %.1f%% measured, %.1f%% predicted (F %.2f B %.2f W %.2f ms)\n",
        k, mean, m.makespan_ms, 100 * m.bubble_fraction, 100 * m.predicted_bubble_fraction, m.costs.f,
        m.costs.b, m.costs.w);
  }
  if (r.verification) {
    const Verification& v = *r.verification;
    std::printf(
        "verify against one process: %s; first-step losses %s, later losses rel err %.2e, gradients %.2e, "
        "parameters %.2e (bound %.0e)%s\n",
        v.passed() ? "PASSED" : "FAILED", v.first_step_losses_identical ? "bit-identical" : "DIFFER",
        v.later_loss_rel_err, v.grad_rel_err, v.param_rel_err, v.bound,
        s.params.kind == ScheduleKind::kDualPipe
            ? (v.replicas_identical ? ", replicas bit-identical" : ", replicas DIFFER")
            : "");
  }
  std::printf("parameters digest %s\n", r.params_digest.c_str());
}

int run_pipeline_train(int argc, char** argv) {
  TrainCliOptions c;
  Args args(argv[0], "Train the MLP stage model with a pipeline schedule under MPI (mpirun -np N ...).");
  args.option("--schedule", &c.schedule, "gpipe|1f1b|zb1p|dualpipe|dualpipev", "NAME");
  args.option("--microbatches", &c.microbatches, "micro-batches per step (0: 4 per rank)");
  args.option("--steps", &c.steps, "optimizer steps");
  args.option("--dtype", &c.dtype, "f32|f64", "TYPE");
  args.option("--tokens", &c.tokens, "rows per micro-batch");
  args.option("--hidden", &c.hidden, "hidden size");
  args.option("--ffn", &c.ffn, "SwiGLU inner size");
  args.option("--layers", &c.layers, "MLP blocks in the whole model (0: one per stage)");
  args.option("--lr", &c.lr, "AdamW learning rate");
  args.option("--seed", &c.seed, "weights and data seed");
  args.option("--delay-ms", &c.delay_ms, "sleep up to this long before each op (results must not change)");
  args.flag("--verify", &c.verify, "compare with a single-process run (exit 1 if it differs)");
  args.option("--inject-fault", &c.fault, "testing --verify: drop-weight-grad|corrupt-activation on rank 0",
              "NAME");
  args.option("--trace", &c.trace, "write the last step as a Chrome trace JSON", "FILE");
  args.option("--svg", &c.svg, "write the last step as an SVG timeline", "FILE");
  args.flag("--grid", &c.grid, "print the last step as a text grid");
  args.flag("--json", &c.json, "print one JSON object");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  MpiSession mpi;
  if (!args.given("--threads") && std::getenv("FATHOM_THREADS") == nullptr) {
    set_default_pool_threads(threads_per_local_rank(MPI_COMM_WORLD));
  }
  auto options = to_train_options(c, mpi.size());
  if (!options.ok()) return fail(args.command(), options.status());
  auto report = train(*options, MPI_COMM_WORLD);
  if (!report.ok()) return fail(args.command(), report.status());
  if (mpi.rank() != 0) return 0;
  if (Status st = write_pictures(report->timeline, c.trace, c.svg); !st.ok()) return fail(args.command(), st);
  if (c.json) {
    print_json_line(train_json(*options, *report).dump());
  } else {
    if (c.grid) std::printf("%s", render_grid(report->timeline).c_str());
    print_train(*options, *report);
  }
  if (report->verification && !report->verification->passed()) {
    return fail(args.command(), internal_error("the pipeline run differs from the single-process run"));
  }
  return 0;
}

bool wants_deepseek(int argc, char** argv) {  // `pipeline train --model ...`: train_pipelined_cli.cpp
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--model") == 0 || std::strncmp(argv[i], "--model=", 8) == 0) return true;
  }
  return false;
}

int run_pipeline(int argc, char** argv) {
  static const char* kUsage =
      "usage: fathom pipeline <command> [options]\n"
      "  simulate   timing of a schedule under given op costs (makespan, idle, bubble, activations)\n"
      "  show       draw a simulated schedule: text grid, --trace FILE (Chrome JSON), --svg FILE\n"
      "  train      run a schedule for real: mpirun -np N fathom pipeline train --schedule S ...\n"
      "             (--model deepseek: DeepSeek-V3 layers; see --model deepseek --help)\n"
      "Run `fathom pipeline <command> --help` for its options.\n";
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 1 : 0;
  }
  const std::string sub = argv[1];
  std::string name = std::string(argv[0]) + " " + sub;
  std::vector<char*> rest(argv + 1, argv + argc);
  rest[0] = name.data();
  const int n = static_cast<int>(rest.size());
  if (sub == "simulate") return run_simulate(n, rest.data());
  if (sub == "show") return run_show(n, rest.data());
  if (sub == "train" && wants_deepseek(n, rest.data())) return run_pipeline_train_deepseek(n, rest.data());
  if (sub == "train") return run_pipeline_train(n, rest.data());
  return fail(argv[0], invalid_argument("unknown command '{}' (expected simulate, show or train)", sub));
}

}  // namespace

FATHOM_COMMAND("pipeline", "Pipeline-parallel schedules: simulate, show, train (DualPipe, ZB1P, 1F1B)",
               run_pipeline);

}  // namespace fathom::cli
