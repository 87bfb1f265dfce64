// cmd_plot.cpp — `slimshard plot`: curves from `train --metrics` files on one SVG chart, e.g. validation loss
// by step or by bytes communicated, DDP and Slim-DP side by side. Readable in a browser without the terminal.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.h"
#include "slimshard/common.h"

namespace slimshard::cli {
namespace {

struct Curve {
  std::string label;
  std::vector<std::pair<double, double>> points;
};

// The points (x, y) of one metrics file: every step record holding `y`; x is the step or the bytes sent so
// far (the running sum of each step's comm_bytes). With mean_of = k > 1, each point is the mean y of k
// consecutive records at the last one's x (a per-step training loss is too noisy to compare runs by); a
// shorter tail is dropped unless it is all there is.
Curve read_curve(const std::string& spec, const std::string& x, const std::string& y, int mean_of) {
  Curve c;
  const size_t colon = spec.rfind(':');
  const std::string path = colon == std::string::npos ? spec : spec.substr(0, colon);
  c.label = colon == std::string::npos ? path : spec.substr(colon + 1);
  std::ifstream in(path);
  if (!in) throw UsageError("plot: " + path + ": cannot open");
  std::string line;
  double bytes = 0;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      throw UsageError("plot: " + path + ":" + std::to_string(n) + ": not a JSON line");
    }
    if (!j.is_object() || j.value("summary", false) || !j.contains("step")) continue;
    if (j.contains("comm_bytes") && j["comm_bytes"].is_number()) bytes += j["comm_bytes"].get<double>();
    if (!j.contains(y) || !j[y].is_number()) continue;
    c.points.emplace_back(x == "step" ? j["step"].get<double>() : bytes / (1 << 20), j[y].get<double>());
  }
  if (c.points.empty()) throw UsageError("plot: " + path + ": no step records with \"" + y + "\"");
  if (mean_of <= 1) return c;
  std::vector<std::pair<double, double>> means;
  for (size_t i = 0; i < c.points.size(); i += static_cast<size_t>(mean_of)) {
    const size_t end = std::min(c.points.size(), i + static_cast<size_t>(mean_of));
    if (end - i < static_cast<size_t>(mean_of) && !means.empty()) break;
    double sum = 0;
    for (size_t j = i; j < end; ++j) sum += c.points[j].second;
    means.emplace_back(c.points[end - 1].first, sum / static_cast<double>(end - i));
  }
  c.points = std::move(means);
  return c;
}

// 1, 2 or 5 times a power of ten, giving about `want` ticks over [lo, hi].
double tick_step(double lo, double hi, int want) {
  const double raw = (hi - lo) / want, p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

std::string chart(const std::vector<Curve>& curves, const std::string& title, const std::string& xlabel,
                  const std::string& ylabel) {
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const Curve& c : curves)
    for (auto [x, y] : c.points)
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) y1 = y0 + 1;
  const double pad = 0.05 * (y1 - y0);
  y0 -= pad, y1 += pad;
  const double W = 760, H = 460, L = 70, R = 180, T = 40, B = 50, pw = W - L - R, ph = H - T - B;
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return T + (1 - (y - y0) / (y1 - y0)) * ph; };
  static const char* colors[] = {"#4e79a7", "#b07aa1", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948"};
  std::ostringstream s;
  s << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H
    << "' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n"
    << "<text x='" << L << "' y='22' font-size='15'>" << xml_escape(title) << "</text>\n";
  const double xs = tick_step(x0, x1, 6), ys = tick_step(y0, y1, 6);
  for (double v = std::ceil(x0 / xs) * xs; v <= x1 + 1e-9 * xs; v += xs)
    s << "<line x1='" << px(v) << "' x2='" << px(v) << "' y1='" << T << "' y2='" << T + ph
      << "' stroke='#eee'/><text x='" << px(v) << "' y='" << T + ph + 16 << "' text-anchor='middle'>"
      << fmt(v) << "</text>\n";
  for (double v = std::ceil(y0 / ys) * ys; v <= y1 + 1e-9 * ys; v += ys)
    s << "<line x1='" << L << "' x2='" << L + pw << "' y1='" << py(v) << "' y2='" << py(v)
      << "' stroke='#eee'/><text x='" << L - 6 << "' y='" << py(v) + 4 << "' text-anchor='end'>" << fmt(v)
      << "</text>\n";
  s << "<rect x='" << L << "' y='" << T << "' width='" << pw << "' height='" << ph
    << "' fill='none' stroke='#888'/>\n<text x='" << L + pw / 2 << "' y='" << H - 12
    << "' text-anchor='middle'>" << xml_escape(xlabel) << "</text>\n<text transform='translate(18,"
    << T + ph / 2 << ") rotate(-90)' text-anchor='middle'>" << xml_escape(ylabel) << "</text>\n";
  for (size_t i = 0; i < curves.size(); ++i) {
    const char* col = colors[i % (sizeof colors / sizeof *colors)];
    s << "<polyline fill='none' stroke='" << col << "' stroke-width='2' points='";
    for (auto [x, y] : curves[i].points) s << px(x) << ',' << py(y) << ' ';
    s << "'/>\n";
    for (auto [x, y] : curves[i].points)
      s << "<circle cx='" << px(x) << "' cy='" << py(y) << "' r='2.5' fill='" << col << "'/>";
    const auto [lx, ly] = curves[i].points.back();
    const double yy = T + 14 + 18.0 * static_cast<double>(i);
    s << "\n<line x1='" << L + pw + 12 << "' x2='" << L + pw + 32 << "' y1='" << yy - 4 << "' y2='" << yy - 4
      << "' stroke='" << col << "' stroke-width='3'/><text x='" << L + pw + 38 << "' y='" << yy << "'>"
      << xml_escape(curves[i].label) << " (" << fmt(std::round(ly * 1e4) / 1e4) << " at "
      << fmt(std::round(lx * 10) / 10) << ")</text>\n";
  }
  s << "</svg>\n";
  return s.str();
}

}  // namespace

Runner add_plot(CLI::App& app) {
  struct Flags {
    std::vector<std::string> files;
    std::string x = "step", y = "val_loss", title, out = "plot.svg";
    int mean_of = 1;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* sub = app.add_subcommand("plot", "Draw curves from train --metrics files as one SVG chart");
  sub->footer(
      "Example:\n"
      "  slimshard plot --x bytes --y val_loss ddp.jsonl:DDP slim.jsonl:Slim-DP --out loss-vs-bytes.svg");
  sub->add_option("files", f->files, "metrics files, each FILE or FILE:LABEL")->required();
  sub->add_option("--x", f->x, "step | bytes (MiB sent per rank so far)")
      ->capture_default_str()
      ->check(CLI::IsMember({"step", "bytes"}));
  sub->add_option("--y", f->y, "a per-step metric: loss, val_loss, val_acc, step_ms, ...")
      ->capture_default_str();
  sub->add_option("--mean-of", f->mean_of,
                  "plot the mean of every K consecutive points (e.g. the training loss)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub->add_option("--title", f->title, "chart title (default: y by x)");
  sub->add_option("--out", f->out, "SVG file to write")->capture_default_str();
  return [f]() {
    std::vector<Curve> curves;
    for (const std::string& spec : f->files) curves.push_back(read_curve(spec, f->x, f->y, f->mean_of));
    const std::string xlabel = f->x == "step" ? "step" : "MiB sent per rank";
    const std::string ylabel = f->mean_of > 1 ? f->y + " (mean of " + std::to_string(f->mean_of) + ")" : f->y;
    const std::string title = f->title.empty() ? ylabel + " by " + xlabel : f->title;
    write_file_atomic(f->out, chart(curves, title, xlabel, ylabel));
    std::printf("wrote %s (%zu curves)\n", f->out.c_str(), curves.size());
    return 0;
  };
}

}  // namespace slimshard::cli
