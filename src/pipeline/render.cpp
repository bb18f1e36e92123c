// Pictures of a timeline: a text grid for terminals, Chrome trace event JSON for chrome://tracing
// and Perfetto, and a standalone SVG. They draw what they are given (simulated or measured); they
// do not compute schedules or statistics.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "pipeline/pipeline.h"

namespace fathom::pipeline {

Timeline timeline_from_simulation(const Schedule& s, const Simulation& sim, std::string title) {
  Timeline t;
  t.title = std::move(title);
  t.n_ranks = s.params.n_ranks;
  t.n_directions = s.n_directions;
  t.makespan = sim.makespan;
  t.idle = sim.idle;
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const Op& op = s.ranks[r][i];
      if (!op.is_compute()) continue;
      t.events.push_back({static_cast<int>(r), op, sim.times[r][i].start, sim.times[r][i].end});
    }
  }
  return t;
}

std::string render_grid(const Timeline& t, double cell) {
  constexpr int kCellChars = 4;
  if (cell <= 0) {
    cell = std::numeric_limits<double>::infinity();
    for (const TimelineEvent& e : t.events) {
      if (e.end > e.start) cell = std::min(cell, e.end - e.start);
    }
    if (!std::isfinite(cell)) cell = 1;
  }
  const int n_cells = std::max(1, static_cast<int>(std::ceil(t.makespan / cell - 1e-9)));
  const size_t width = static_cast<size_t>(n_cells) * kCellChars;
  std::vector<std::string> rows(static_cast<size_t>(t.n_ranks), std::string(width, ' '));
  for (const TimelineEvent& e : t.events) {
    if (e.rank < 0 || e.rank >= t.n_ranks) continue;
    const size_t c0 = static_cast<size_t>(std::lround(e.start / cell)) * kCellChars;
    size_t c1 = static_cast<size_t>(std::lround(e.end / cell)) * kCellChars;
    c1 = std::min(std::max(c1, c0 + kCellChars), width);
    if (c0 >= width) continue;
    std::string& row = rows[static_cast<size_t>(e.rank)];
    const std::string label = op_label(e.op);
    for (size_t c = c0; c < c1; ++c) {
      const size_t k = c - c0;
      row[c] = c + 1 == c1 ? '|' : (k < label.size() ? label[k] : ' ');
    }
  }
  std::string out = fmt::format("{}\n", t.title);
  out += fmt::format(
      "one cell = {:g}{}; upper case: direction 0, lower case: direction 1; "
      "F forward, B input grad, W weight grad, BW full backward, F&b overlapped pair\n",
      cell, t.unit.empty() ? " units" : " " + t.unit);
  for (int r = 0; r < t.n_ranks; ++r) {
    const double idle = static_cast<size_t>(r) < t.idle.size() ? t.idle[static_cast<size_t>(r)] : 0;
    out += fmt::format("rank {:>3} |{}| idle {:g}\n", r, rows[static_cast<size_t>(r)], idle);
  }
  return out;
}

namespace {

nlohmann::json task_json(const Task& t) {
  return {{"direction", t.direction}, {"stage", t.stage}, {"mb", t.mb}};
}

// Simulator units are drawn as milliseconds so the viewer's ruler reads naturally.
double to_us(const Timeline& t, double v) {
  return t.unit == "us" ? v : v * 1000.0;
}

}  // namespace

std::string render_chrome_trace(const Timeline& t) {
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 0}, {"args", {{"name", t.title}}}});
  for (int r = 0; r < t.n_ranks; ++r) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 0},
                      {"tid", r},
                      {"args", {{"name", fmt::format("rank {}", r)}}}});
    events.push_back(
        {{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", 0}, {"tid", r}, {"args", {{"sort_index", r}}}});
  }
  for (const TimelineEvent& e : t.events) {
    nlohmann::json args = {{"task", task_json(e.op.task)}};
    if (e.op.kind == OpKind::kForwardBackward) args["backward_task"] = task_json(e.op.task2);
    events.push_back({{"name", op_label(e.op)},
                      {"cat", std::string(op_kind_name(e.op.kind))},
                      {"ph", "X"},
                      {"pid", 0},
                      {"tid", e.rank},
                      {"ts", to_us(t, e.start)},
                      {"dur", to_us(t, e.end - e.start)},
                      {"args", args}});
  }
  nlohmann::json doc = {{"traceEvents", events},
                        {"displayTimeUnit", "ms"},
                        {"otherData",
                         {{"title", t.title},
                          {"unit", t.unit.empty() ? "simulator units drawn as ms" : t.unit},
                          {"makespan", t.makespan},
                          {"idle", t.idle}}}};
  return doc.dump(1);
}

namespace {

std::string xml_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Fill colours: [kind][direction]; direction 1 is a lighter shade of the same hue.
const char* fill(OpKind kind, int direction) {
  static const char* kColors[][2] = {
      {"#4e79a7", "#a0cbe8"},  // F
      {"#f28e2b", "#ffbe7d"},  // BW (full backward)
      {"#59a14f", "#8cd17d"},  // B (input gradient)
      {"#b07aa1", "#d4a6c8"},  // W
  };
  const int d = direction == 0 ? 0 : 1;
  switch (kind) {
    case OpKind::kForward:
      return kColors[0][d];
    case OpKind::kBackward:
      return kColors[1][d];
    case OpKind::kBackwardInput:
      return kColors[2][d];
    case OpKind::kWeight:
      return kColors[3][d];
    default:
      return "#999999";
  }
}

struct SvgLayout {
  double left = 70, top = 48, lane = 26, gap = 6, width = 1100;
  double scale = 1;  // px per time unit
  double x(double v) const { return left + v * scale; }
  double y(int rank) const { return top + rank * (lane + gap); }
};

void svg_op(std::string& out, const SvgLayout& L, const TimelineEvent& e) {
  const double x = L.x(e.start), w = std::max(1.0, L.x(e.end) - x), y = L.y(e.rank);
  const std::string raw = op_label(e.op);
  const std::string label = xml_escape(raw);
  if (e.op.kind == OpKind::kForwardBackward) {  // two halves in one black border, as in the DualPipe figure
    out += fmt::format(R"(<rect x="{:.2f}" y="{:.2f}" width="{:.2f}" height="{:.2f}" fill="{}"/>)", x, y, w,
                       L.lane / 2, fill(OpKind::kForward, e.op.task.direction));
    out += fmt::format(R"(<rect x="{:.2f}" y="{:.2f}" width="{:.2f}" height="{:.2f}" fill="{}"/>)", x,
                       y + L.lane / 2, w, L.lane / 2, fill(OpKind::kBackward, e.op.task2.direction));
    out += fmt::format(
        R"(<rect x="{:.2f}" y="{:.2f}" width="{:.2f}" height="{:.2f}" fill="none" stroke="#000" stroke-width="1.2"><title>{}</title></rect>)",
        x, y, w, L.lane, label);
  } else {
    out += fmt::format(
        R"(<rect x="{:.2f}" y="{:.2f}" width="{:.2f}" height="{:.2f}" fill="{}" stroke="#fff" stroke-width="0.5"><title>{}</title></rect>)",
        x, y, w, L.lane, fill(e.op.kind, e.op.task.direction), label);
  }
  if (w >= 5.0 * static_cast<double>(raw.size()) + 2) {  // about 5 px per character at 8 px
    out += fmt::format(R"(<text x="{:.2f}" y="{:.2f}" font-size="8" text-anchor="middle">{}</text>)",
                       x + w / 2, y + L.lane / 2 + 3, label);
  }
  out += "\n";
}

}  // namespace

std::string render_svg(const Timeline& t) {
  SvgLayout L;
  L.scale = t.makespan > 0 ? (L.width - L.left - 90) / t.makespan : 1;
  const double height = L.y(t.n_ranks) + 56;
  std::string out = fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="{:.0f}" height="{:.0f}" font-family="sans-serif">)"
      "\n<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n"
      R"(<text x="{:.0f}" y="22" font-size="14">{}</text>)"
      "\n",
      L.width, height, L.left, xml_escape(t.title));
  for (int r = 0; r < t.n_ranks; ++r) {
    const double idle = static_cast<size_t>(r) < t.idle.size() ? t.idle[static_cast<size_t>(r)] : 0;
    out += fmt::format(R"(<text x="8" y="{:.2f}" font-size="11">rank {}</text>)", L.y(r) + L.lane / 2 + 4, r);
    out += fmt::format(R"(<rect x="{:.2f}" y="{:.2f}" width="{:.2f}" height="{:.2f}" fill="#f2f2f2"/>)",
                       L.left, L.y(r), L.x(t.makespan) - L.left, L.lane);
    out += fmt::format(R"(<text x="{:.2f}" y="{:.2f}" font-size="10">idle {:.3g}{}</text>)",
                       L.x(t.makespan) + 6, L.y(r) + L.lane / 2 + 4, idle, xml_escape(t.unit));
    out += "\n";
  }
  for (const TimelineEvent& e : t.events) {
    if (e.rank >= 0 && e.rank < t.n_ranks) svg_op(out, L, e);
  }
  // Time axis: about ten ticks at a round step.
  const double axis_y = L.y(t.n_ranks) + 4;
  const double raw = t.makespan > 0 ? t.makespan / 10 : 1;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = raw / mag < 2 ? 2 * mag : raw / mag < 5 ? 5 * mag : 10 * mag;
  for (double v = 0; v <= t.makespan + 1e-9; v += step) {
    out += fmt::format(R"(<line x1="{0:.2f}" x2="{0:.2f}" y1="{1:.2f}" y2="{2:.2f}" stroke="#666"/>)", L.x(v),
                       axis_y, axis_y + 5);
    out += fmt::format(R"(<text x="{:.2f}" y="{:.2f}" font-size="9" text-anchor="middle">{:g}</text>)",
                       L.x(v), axis_y + 15, v);
  }
  // Legend.
  double lx = L.left;
  const double ly = axis_y + 26;
  auto legend = [&](const char* color, const char* name) {
    out += fmt::format(R"(<rect x="{:.0f}" y="{:.0f}" width="12" height="12" fill="{}"/>)", lx, ly, color);
    out += fmt::format(R"(<text x="{:.0f}" y="{:.0f}" font-size="10">{}</text>)", lx + 16, ly + 10,
                       xml_escape(name));
    lx += 30 + 6.0 * static_cast<double>(std::string_view(name).size());
  };
  legend(fill(OpKind::kForward, 0), "F");
  legend(fill(OpKind::kBackwardInput, 0), "B (input grad)");
  legend(fill(OpKind::kWeight, 0), "W (weight grad)");
  legend(fill(OpKind::kBackward, 0), "BW (full backward)");
  if (t.n_directions > 1) legend(fill(OpKind::kForward, 1), "lighter: direction 1");
  legend("#ffffff", "black border: overlapped F&B");
  out += fmt::format(R"(<text x="{:.0f}" y="{:.0f}" font-size="10">time ({})</text>)", L.x(t.makespan) + 6,
                     axis_y + 15, t.unit.empty() ? "units" : xml_escape(t.unit));
  out += "\n</svg>\n";
  return out;
}

}  // namespace fathom::pipeline
