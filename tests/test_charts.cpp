// test_charts.cpp — the SVG line chart in-process: every point drawn where a linear map of its axes puts it
// (inside the frame, ordered as the data, midpoints at midpoints), ticks at round values that cover the data,
// the legend showing each curve's last point, labels escaped; and the metrics curves it is drawn from (the
// bytes axis a running sum, means of k points).
#include <gtest/gtest.h>

#include <regex>

#include "helpers.h"
#include "slimshard/charts.h"
#include "slimshard/common.h"
#include "slimshard/train.h"

using namespace slimshard;

namespace {

struct Point {
  double x, y;
};

std::vector<Point> circles(const std::string& svg) {
  std::vector<Point> out;
  const std::regex re("<circle cx='([-0-9.e]+)' cy='([-0-9.e]+)'");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back({std::stod((*it)[1]), std::stod((*it)[2])});
  return out;
}

std::vector<double> tick_labels(const std::string& svg, const std::string& anchor) {
  std::vector<double> out;
  const std::regex re("text-anchor='" + anchor + "'>([-0-9.e]+)</text>");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back(std::stod((*it)[1]));
  return out;
}

}  // namespace

TEST(Charts, LineChartPlacesEveryPointOnLinearAxes) {
  const std::vector<Curve> curves{{"a <&> b", {{0, 1}, {5, 2}, {10, 3}}}, {"second", {{2.5, 3}, {7.5, 1}}}};
  const std::string svg = line_chart(curves, "loss by step", "step", "loss");
  const std::vector<Point> p = circles(svg);  // coordinates are written with 6 digits: compare to 0.01 px
  ASSERT_EQ(p.size(), 5u);
  // Linear in x and y: the midpoint of the data is the midpoint of the drawing.
  EXPECT_NEAR(p[1].x, (p[0].x + p[2].x) / 2, 0.01);
  EXPECT_NEAR(p[1].y, (p[0].y + p[2].y) / 2, 0.01);
  EXPECT_NEAR(p[3].x, (p[0].x + p[1].x) / 2, 0.01);
  // Larger y is higher on the page; equal y at equal height across curves.
  EXPECT_LT(p[2].y, p[0].y);
  EXPECT_NEAR(p[3].y, p[2].y, 0.01);
  EXPECT_NEAR(p[4].y, p[0].y, 0.01);
  // Inside the frame.
  const std::regex frame(
      "<rect x='([0-9.]+)' y='([0-9.]+)' width='([0-9.]+)' height='([0-9.]+)' fill='none'");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(svg, m, frame));
  const double fx = std::stod(m[1]), fy = std::stod(m[2]), fw = std::stod(m[3]), fh = std::stod(m[4]);
  for (const Point& q : p) {
    EXPECT_GE(q.x, fx - 1e-9);
    EXPECT_LE(q.x, fx + fw + 1e-9);
    EXPECT_GT(q.y, fy);
    EXPECT_LT(q.y, fy + fh);
  }
  EXPECT_NEAR(p[0].x, fx, 0.01);       // the smallest x at the left edge
  EXPECT_NEAR(p[2].x, fx + fw, 0.01);  // the largest at the right
  // Ticks: 1, 2 or 5 times a power of ten, evenly spaced, covering the data's x range.
  const std::vector<double> xt = tick_labels(svg, "middle");
  ASSERT_GE(xt.size(), 3u);
  const double step = xt[1] - xt[0];
  for (size_t i = 1; i < xt.size(); ++i) EXPECT_NEAR(xt[i] - xt[i - 1], step, 1e-9);
  const double mantissa = step / std::pow(10.0, std::floor(std::log10(step)));
  EXPECT_TRUE(std::abs(mantissa - 1) < 1e-9 || std::abs(mantissa - 2) < 1e-9 || std::abs(mantissa - 5) < 1e-9)
      << step;
  EXPECT_LE(xt.front(), 0 + 1e-9);
  EXPECT_GE(xt.back(), 10 - 1e-9);
  // The legend: each curve with its last point; labels escaped.
  EXPECT_NE(svg.find("a &lt;&amp;&gt; b (3 at 10)"), std::string::npos) << svg;
  EXPECT_NE(svg.find("second (1 at 7.5)"), std::string::npos) << svg;
  EXPECT_EQ(svg.find("a <&> b"), std::string::npos);
  // Each curve its own colour from the palette.
  EXPECT_NE(svg.find(std::string("stroke='") + palette(0) + "' stroke-width='2'"), std::string::npos);
  EXPECT_NE(svg.find(std::string("stroke='") + palette(1) + "' stroke-width='2'"), std::string::npos);
}

TEST(Charts, MetricsCurvesByStepAndByBytes) {
  const std::string dir = test::scratch_dir(), path = dir + "/m.jsonl";
  write_file_atomic(
      path,
      "{\"step\":1,\"loss\":4,\"comm_bytes\":1048576}\n"
      "{\"step\":2,\"loss\":2,\"comm_bytes\":2097152,\"val_loss\":3}\n"
      "{\"step\":3,\"loss\":1,\"comm_bytes\":1048576}\n"
      "{\"summary\":true,\"step\":3,\"loss\":7,\"val_loss\":9}\n"
      "{\"summary\":3.3,\"step\":4,\"loss\":1}\n");  // a summary of any value is not a step (fuzzed)
  const Curve by_step = metrics_curve(path + ":run", "step", "loss", 1);
  EXPECT_EQ(by_step.label, "run");
  ASSERT_EQ(by_step.points.size(), 3u);  // the summary line is not a step
  EXPECT_EQ(by_step.points[2], std::make_pair(3.0, 1.0));
  const Curve by_bytes = metrics_curve(path, "bytes", "loss", 1);
  EXPECT_EQ(by_bytes.label, path);
  ASSERT_EQ(by_bytes.points.size(), 3u);
  EXPECT_EQ(by_bytes.points[0].first, 1.0);  // MiB sent so far: 1, 1+2, 1+2+1
  EXPECT_EQ(by_bytes.points[1].first, 3.0);
  EXPECT_EQ(by_bytes.points[2].first, 4.0);
  // Records without the metric still count their bytes.
  const Curve val = metrics_curve(path, "bytes", "val_loss", 1);
  ASSERT_EQ(val.points.size(), 1u);
  EXPECT_EQ(val.points[0], std::make_pair(3.0, 3.0));
  // Means of 2: (4+2)/2 at step 2; the lone third point is dropped.
  const Curve means = metrics_curve(path, "step", "loss", 2);
  ASSERT_EQ(means.points.size(), 1u);
  EXPECT_EQ(means.points[0], std::make_pair(2.0, 3.0));
  EXPECT_EQ(metrics_summary(path).value("loss", 0.0), 7.0);
  write_file_atomic(dir + "/bad.jsonl", "{\"step\":1,\"loss\":2}\n{\"step\":2,\"lo");
  try {
    metrics_curve(dir + "/bad.jsonl", "step", "loss", 1);
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.jsonl:2"), std::string::npos) << e.what();
  }
}
