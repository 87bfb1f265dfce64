// charts.cpp — SVG pages: a plan (memory per op by choice — persistent, transient, activations — and the
// predicted throughput next to the uniform baselines) and line charts of curves (see charts.h).
#include "slimshard/charts.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <regex>
#include <sstream>

#include "slimshard/common.h"

namespace slimshard {

const char* palette(size_t i) {
  static const char* colors[] = {"#4e79a7", "#b07aa1", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948"};
  return colors[i % (sizeof colors / sizeof *colors)];
}

const char* strategy_color(Strategy s) {
  switch (s) {
    case Strategy::ddp:
      return palette(0);
    case Strategy::slim:
      return palette(1);
    case Strategy::zero1:
      return palette(2);
    case Strategy::zero2:
      return palette(3);
    case Strategy::zero3:
      return palette(4);
    case Strategy::hsdp:
      return palette(5);
    case Strategy::hsdp2:
      return palette(6);
  }
  return "#999";
}

namespace {

const char* kTransientColor = "#bab0ac";
const char* kActivationColor = "#edc948";

std::string num(double v, int decimals = 1) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", decimals, v);
  return b;
}

struct Row {
  std::string label;
  Strategy strategy = Strategy::ddp;
  bool mixed = false;
  std::string choice;
  double persistent = 0, transient = 0, activations = 0;
  double intra = 0, inter = 0;  // bytes per step per rank, within a host and between hosts
  int count = 0;
};

// One row per op, or per role ("blocks.*.mlp.fc") when the model is deep.
std::vector<Row> memory_rows(const CostModel& model, const SearchResult& plan, bool group) {
  const auto& ops = model.ops();
  std::vector<Row> rows;
  std::map<std::string, size_t> index;
  const std::regex block_index("blocks\\.[0-9]+\\.");
  for (size_t i = 0; i < ops.size(); ++i) {
    const ChoiceCost& cc = plan.cost.per_op.at(i);
    const std::string key = group ? std::regex_replace(ops[i].name, block_index, "blocks.*.") : ops[i].name;
    const std::string choice = std::string(strategy_name(cc.choice.strategy)) +
                               (cc.choice.splits > 1 ? " ×" + std::to_string(cc.choice.splits) : "");
    auto it = index.find(key);
    if (it == index.end()) {
      it = index.emplace(key, rows.size()).first;
      Row r;
      r.label = key, r.strategy = cc.choice.strategy, r.choice = choice;
      rows.push_back(r);
    }
    Row& r = rows[it->second];
    if (r.choice != choice) r.mixed = true;
    r.persistent += static_cast<double>(cc.mem.persistent());
    r.intra += cc.intra_bytes, r.inter += cc.inter_bytes;
    r.transient = std::max(r.transient, static_cast<double>(cc.transient_bytes));
    r.activations += static_cast<double>(
        ops[i].act_bytes.count(plan.cost.micro_batch) ? ops[i].act_bytes.at(plan.cost.micro_batch) : 0);
    r.count++;
  }
  return rows;
}

void legend_box(std::ostringstream& s, int x, int y, const char* fill, const std::string& label) {
  s << "<rect x='" << x << "' y='" << y << "' width='12' height='12' fill='" << fill << "'/><text x='"
    << x + 16 << "' y='" << y + 10 << "'>" << xml_escape(label) << "</text>\n";
}

constexpr int kLeft = 260, kBarWidth = 560, kRowHeight = 18;
constexpr double kMiB = 1024.0 * 1024.0;

void draw_memory(std::ostringstream& s, const std::vector<Row>& rows, int top, bool grouped, bool hosts) {
  s << "<text x='20' y='" << top - 12 << "' font-weight='bold'>Memory per rank by op"
    << (grouped ? " (blocks summed over layers)" : "") << "</text>\n";
  int lx = kLeft + 200;
  for (Strategy st : {Strategy::ddp, Strategy::zero1, Strategy::zero2, Strategy::zero3, Strategy::hsdp}) {
    legend_box(s, lx, top - 24, strategy_color(st), strategy_name(st));
    lx += 70;
  }
  legend_box(s, lx, top - 24, kTransientColor, "transient");
  legend_box(s, lx + 80, top - 24, kActivationColor, "activations");
  double widest = 1;
  for (const Row& r : rows) widest = std::max(widest, r.persistent + r.transient + r.activations);
  const double scale = kBarWidth / widest;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const int y = top + static_cast<int>(i) * kRowHeight;
    double x = kLeft;
    s << "<text x='" << kLeft - 8 << "' y='" << y + 13 << "' text-anchor='end'>" << xml_escape(r.label)
      << " — " << (r.mixed ? "mixed" : xml_escape(r.choice)) << "</text>\n";
    const double segs[3] = {r.persistent, r.transient, r.activations};
    const char* fills[3] = {strategy_color(r.strategy), kTransientColor, kActivationColor};
    const char* names[3] = {"persistent ", "transient ", "activations "};
    for (int k = 0; k < 3; ++k) {
      const double w = segs[k] * scale;
      if (w <= 0) continue;
      s << "<rect x='" << num(x) << "' y='" << y + 2 << "' width='" << num(std::max(w, 0.5)) << "' height='"
        << kRowHeight - 4 << "' fill='" << fills[k] << "'><title>" << xml_escape(r.label) << ": " << names[k]
        << num(segs[k] / kMiB, 2) << " MiB</title></rect>\n";
      x += w;
    }
    s << "<text x='" << num(x + 6) << "' y='" << y + 13 << "' fill='#555'>"
      << num((r.persistent + r.transient + r.activations) / kMiB) << " MiB";
    if (hosts)  // what the op sends per step on each link
      s << " · sends " << num(r.intra / kMiB, 2) << " MiB in host, " << num(r.inter / kMiB, 2) << " between";
    s << "</text>\n";
  }
}

void draw_throughput(std::ostringstream& s, const SearchResult& plan,
                     const std::vector<std::pair<std::string, SearchResult>>& baselines, int top) {
  s << "<text x='20' y='" << top << "' font-weight='bold'>Predicted throughput (tokens/s)</text>\n";
  std::vector<std::pair<std::string, SearchResult>> all{{"osdp plan", plan}};
  all.insert(all.end(), baselines.begin(), baselines.end());
  double fastest = 1;
  for (const auto& [name, r] : all) fastest = std::max(fastest, r.cost.tokens_per_s);
  for (size_t i = 0; i < all.size(); ++i) {
    const auto& [name, r] = all[i];
    const int y = top + 16 + static_cast<int>(i) * 28;
    s << "<text x='" << kLeft - 8 << "' y='" << y + 15 << "' text-anchor='end'>" << xml_escape(name)
      << "</text>\n";
    if (!r.fits) {
      s << "<text x='" << kLeft << "' y='" << y + 15 << "' fill='#b00'>does not fit (needs "
        << num(r.cost.peak_bytes / kMiB) << " MiB)</text>\n";
      continue;
    }
    const double w = r.cost.tokens_per_s / fastest * (kBarWidth - 120);
    s << "<rect x='" << kLeft << "' y='" << y << "' width='" << num(w) << "' height='20' fill='"
      << (i == 0 ? palette(5) : "#9c9c9c") << "'/>\n<text x='" << num(kLeft + w + 6) << "' y='" << y + 15
      << "'>" << num(r.cost.tokens_per_s, 0) << " (" << num(r.cost.tokens_per_s / plan.cost.tokens_per_s, 2)
      << "× plan), peak " << num(r.cost.peak_bytes / kMiB) << " MiB</text>\n";
  }
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

}  // namespace

std::string plan_svg(const CostModel& model, const SearchResult& plan,
                     const std::vector<std::pair<std::string, SearchResult>>& baselines) {
  const bool group = model.ops().size() > 40;
  const std::vector<Row> rows = memory_rows(model, plan, group);
  const int W = 1000, top = 110;
  const int thr_top = top + static_cast<int>(rows.size()) * kRowHeight + 70;
  const int H = thr_top + 40 + 28 * static_cast<int>(baselines.size() + 1) + 40;
  std::ostringstream s;
  s << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H
    << "' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n";
  s << "<text x='20' y='28' font-size='18' font-weight='bold'>OSDP plan: "
    << xml_escape(model.model().describe()) << "</text>\n";
  s << "<text x='20' y='50'>" << model.options().world << " ranks"
    << (model.options().hosts() > 1 ? " on " + std::to_string(model.options().hosts()) + " hosts" : "")
    << ", global batch " << model.options().global_batch << ", micro-batch " << plan.cost.micro_batch << " ("
    << plan.cost.accum << " per step), costs from " << xml_escape(model.source()) << "</text>\n";
  s << "<text x='20' y='70'>predicted peak per rank " << num(plan.cost.peak_bytes / kMiB)
    << " MiB (persistent " << num(plan.cost.persistent_bytes / kMiB) << " + activations "
    << num(plan.cost.activation_bytes / kMiB) << " + largest transient "
    << num(plan.cost.transient_bytes / kMiB) << "), step " << num(plan.cost.step_ms) << " ms, "
    << num(plan.cost.tokens_per_s, 0) << " tokens/s</text>\n";
  draw_memory(s, rows, top, group, model.options().hosts() > 1);
  draw_throughput(s, plan, baselines, thr_top);
  s << "</svg>\n";
  return s.str();
}

std::string line_chart(const std::vector<Curve>& curves, const std::string& title, const std::string& xlabel,
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
    const char* col = palette(i);
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

}  // namespace slimshard
