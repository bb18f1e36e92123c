// The loss curve RUN_DIR/loss.svg: train loss (per step) and validation loss (per eval) against
// tokens trained, with labelled, ticked axes. Plain SVG text, no dependency.
#include "train/curve.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace fathom::train {
namespace {

constexpr double kW = 800, kH = 480, kLeft = 70, kRight = 20, kTop = 40, kBottom = 60;

// About n "nice" tick values covering [lo, hi].
std::vector<double> ticks(double lo, double hi, int n) {
  const double span = hi - lo > 0 ? hi - lo : 1.0;
  const double raw = span / n;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  }
  std::vector<double> t;
  for (double v = std::ceil(lo / step) * step; v <= hi + 1e-9 * span; v += step) t.push_back(v);
  return t;
}

std::string polyline(const std::vector<std::pair<double, double>>& pts, const char* color, double x0,
                     double x1, double y0, double y1) {
  std::string s = fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"", color);
  for (const auto& [x, y] : pts) {
    const double px = kLeft + (x - x0) / (x1 - x0) * (kW - kLeft - kRight);
    const double py = kTop + (1.0 - (y - y0) / (y1 - y0)) * (kH - kTop - kBottom);
    s += fmt::format("{:.1f},{:.1f} ", px, py);
  }
  return s + "\"/>\n";
}

}  // namespace

std::string loss_curve_svg(const std::vector<CurvePoint>& points, const std::string& title) {
  std::vector<std::pair<double, double>> train, val;
  for (const CurvePoint& p : points) {
    if (std::isfinite(p.loss)) train.emplace_back(static_cast<double>(p.tokens), p.loss);
    if (p.val_loss >= 0 && std::isfinite(p.val_loss))
      val.emplace_back(static_cast<double>(p.tokens), p.val_loss);
  }
  double x0 = 0, x1 = 1, y0 = 1e30, y1 = -1e30;
  for (const auto* v : {&train, &val}) {
    for (const auto& [x, y] : *v) {
      x1 = std::max(x1, x);
      y0 = std::min(y0, y);
      y1 = std::max(y1, y);
    }
  }
  if (y0 > y1) y0 = 0, y1 = 1;
  if (y1 - y0 < 1e-6) y1 = y0 + 1;
  y0 = std::max(0.0, y0 - 0.05 * (y1 - y0));
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{3}</text>\n",
      kW, kH, kW / 2, title);
  const double bx = kLeft, by = kH - kBottom, ex = kW - kRight;
  s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"black\"/>\n", bx, by, ex);
  s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"black\"/>\n", bx, by, kTop);
  for (double t : ticks(x0, x1, 6)) {
    const double px = kLeft + (t - x0) / (x1 - x0) * (ex - kLeft);
    const std::string label = t >= 1e6   ? fmt::format("{:g}M", t / 1e6)
                              : t >= 1e3 ? fmt::format("{:g}k", t / 1e3)
                                         : fmt::format("{:g}", t);
    s += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"black\"/>"
        "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
        px, by, by + 5, by + 20, label);
  }
  for (double t : ticks(y0, y1, 6)) {
    const double py = kTop + (1.0 - (t - y0) / (y1 - y0)) * (by - kTop);
    s += fmt::format(
        "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#ddd\"/>"
        "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5:g}</text>\n",
        bx, py, ex, bx - 6, py + 4, t);
  }
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">tokens trained</text>\n", (bx + ex) / 2,
                   kH - 15);
  s += fmt::format(
      "<text x=\"18\" y=\"{0}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {0})\">loss "
      "(cross-entropy, nats)</text>\n",
      (by + kTop) / 2);
  if (train.size() > 1) s += polyline(train, "#1f77b4", x0, x1, y0, y1);
  if (val.size() > 1) s += polyline(val, "#d62728", x0, x1, y0, y1);
  for (const auto& [x, y] : val) {
    const double px = kLeft + (x - x0) / (x1 - x0) * (ex - kLeft);
    const double py = kTop + (1.0 - (y - y0) / (y1 - y0)) * (by - kTop);
    s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"#d62728\"/>\n", px, py);
  }
  s += fmt::format(
      "<rect x=\"{0}\" y=\"{1}\" width=\"14\" height=\"3\" fill=\"#1f77b4\"/><text x=\"{2}\" y=\"{3}\">"
      "train loss</text>\n<rect x=\"{0}\" y=\"{4}\" width=\"14\" height=\"3\" fill=\"#d62728\"/>"
      "<text x=\"{2}\" y=\"{5}\">validation loss</text>\n",
      ex - 140, kTop + 8, ex - 120, kTop + 13, kTop + 26, kTop + 31);
  return s + "</svg>\n";
}

}  // namespace fathom::train
