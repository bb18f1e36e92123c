// Pictures: the grid has a row per rank with the op labels, the Chrome trace is valid JSON with one
// complete event per compute op, and the SVG is well formed with one box per op.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "pipeline/pipeline.h"

namespace fathom::pipeline {
namespace {

Timeline dualpipe_timeline() {
  auto s = make_schedule({.kind = ScheduleKind::kDualPipe, .n_ranks = 4, .n_microbatches = 10});
  EXPECT_TRUE(s.ok());
  auto sim = simulate(*s, {.f = 2, .b = 4, .w = 2});
  EXPECT_TRUE(sim.ok());
  return timeline_from_simulation(*s, *sim, "dualpipe <4 ranks> & 10 micro-batches");
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t pos = s.find(what); pos != std::string::npos; pos = s.find(what, pos + 1)) ++n;
  return n;
}

TEST(PipelineRender, GridHasOneRowPerRankWithOpLabels) {
  const Timeline t = dualpipe_timeline();
  const std::string g = render_grid(t);
  EXPECT_EQ(count(g, "\nrank "), 4u);
  EXPECT_NE(g.find("F0"), std::string::npos);
  EXPECT_NE(g.find("f5"), std::string::npos);
  EXPECT_NE(g.find("&"), std::string::npos);            // an overlapped pair
  EXPECT_NE(g.find("idle 4"), std::string::npos) << g;  // (4/2-1)(F&B+B-3W) = 6+4-6 = 4
  // Rows are equally long.
  size_t len = 0;
  for (size_t pos = g.find("\nrank "); pos != std::string::npos; pos = g.find("\nrank ", pos + 1)) {
    const size_t bar = g.rfind('|', g.find('\n', pos + 1));
    if (len == 0) len = bar - pos;
    EXPECT_EQ(bar - pos, len);
  }
}

TEST(PipelineRender, ChromeTraceIsValidJsonWithOneEventPerOp) {
  const Timeline t = dualpipe_timeline();
  const auto doc = nlohmann::json::parse(render_chrome_trace(t));
  size_t complete = 0;
  for (const auto& e : doc.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    ++complete;
    EXPECT_GE(e.at("dur").get<double>(), 0);
    EXPECT_GE(e.at("tid").get<int>(), 0);
    EXPECT_LT(e.at("tid").get<int>(), 4);
    EXPECT_TRUE(e.at("args").contains("task"));
  }
  EXPECT_EQ(complete, t.events.size());
  EXPECT_EQ(doc.at("otherData").at("idle").size(), 4u);
}

TEST(PipelineRender, SvgIsWellFormedWithABoxPerOpAndEscapedTitle) {
  const Timeline t = dualpipe_timeline();
  const std::string svg = render_svg(t);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_GE(count(svg, "<title>"), t.events.size());
  EXPECT_NE(svg.find("dualpipe &lt;4 ranks&gt; &amp; 10"), std::string::npos);
  EXPECT_EQ(count(svg, "<svg"), count(svg, "</svg>"));
  EXPECT_EQ(count(svg, "<text"), count(svg, "</text>"));
  // Every '&' starts an entity (XML well-formedness for the F&B labels and legend).
  for (size_t pos = svg.find('&'); pos != std::string::npos; pos = svg.find('&', pos + 1)) {
    const std::string rest = svg.substr(pos, 6);
    EXPECT_TRUE(rest.rfind("&amp;", 0) == 0 || rest.rfind("&lt;", 0) == 0 || rest.rfind("&gt;", 0) == 0 ||
                rest.rfind("&quot;", 0) == 0)
        << svg.substr(pos > 40 ? pos - 40 : 0, 80);
  }
}

}  // namespace
}  // namespace fathom::pipeline
