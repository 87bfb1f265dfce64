// svg.cpp — a plan as an SVG page: memory per op (persistent by strategy, transient, activations) and the
// plan's predicted throughput next to the uniform baselines. Readable in a browser without the terminal.
#include <algorithm>
#include <cstdio>
#include <regex>
#include <sstream>

#include "slimshard/common.h"
#include "slimshard/plan.h"

namespace slimshard {
namespace {

const char* color(Strategy s) {
  switch (s) {
    case Strategy::ddp:
      return "#4e79a7";
    case Strategy::zero1:
      return "#f28e2b";
    case Strategy::zero2:
      return "#59a14f";
    case Strategy::zero3:
      return "#e15759";
    case Strategy::slim:
      return "#b07aa1";
  }
  return "#999";
}

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
  int count = 0;
};

}  // namespace

std::string plan_svg(const CostModel& model, const SearchResult& plan,
                     const std::vector<std::pair<std::string, SearchResult>>& baselines) {
  // Rows: one per op, or per role ("blocks.*.mlp.fc") when the model is deep.
  const auto& ops = model.ops();
  const bool group = ops.size() > 40;
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
      index[key] = rows.size();
      Row r;
      r.label = key, r.strategy = cc.choice.strategy, r.choice = choice;
      rows.push_back(r);
      it = index.find(key);
    }
    Row& r = rows[it->second];
    if (r.choice != choice) r.mixed = true;
    r.persistent += static_cast<double>(cc.mem.persistent());
    r.transient = std::max(r.transient, static_cast<double>(cc.transient_bytes));
    r.activations += static_cast<double>(
        ops[i].act_bytes.count(plan.cost.micro_batch) ? ops[i].act_bytes.at(plan.cost.micro_batch) : 0);
    r.count++;
  }
  double widest = 1;
  for (const Row& r : rows) widest = std::max(widest, r.persistent + r.transient + r.activations);

  const int W = 1000, left = 260, bar_w = 560, row_h = 18, top = 110;
  const int mem_h = static_cast<int>(rows.size()) * row_h;
  const int thr_top = top + mem_h + 70;
  const int H = thr_top + 40 + 28 * static_cast<int>(baselines.size() + 1) + 40;
  const double mib = 1024.0 * 1024.0;
  std::ostringstream s;
  s << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H
    << "' font-family='sans-serif' "
    << "font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n";
  s << "<text x='20' y='28' font-size='18' font-weight='bold'>OSDP plan: " << xml_escape(model.model().describe())
    << "</text>\n";
  s << "<text x='20' y='50'>" << model.options().world << " ranks, global batch "
    << model.options().global_batch << ", micro-batch " << plan.cost.micro_batch << " (" << plan.cost.accum
    << " per step), costs from " << xml_escape(model.source()) << "</text>\n";
  s << "<text x='20' y='70'>predicted peak per rank " << num(plan.cost.peak_bytes / mib)
    << " MiB (persistent " << num(plan.cost.persistent_bytes / mib) << " + activations "
    << num(plan.cost.activation_bytes / mib) << " + largest transient "
    << num(plan.cost.transient_bytes / mib) << "), step " << num(plan.cost.step_ms) << " ms, "
    << num(plan.cost.tokens_per_s, 0) << " tokens/s</text>\n";
  s << "<text x='20' y='" << top - 12 << "' font-weight='bold'>Memory per rank by op"
    << (group ? " (blocks summed over layers)" : "") << "</text>\n";
  // Legend.
  int lx = left + 200;
  for (Strategy st : {Strategy::ddp, Strategy::zero1, Strategy::zero2, Strategy::zero3}) {
    s << "<rect x='" << lx << "' y='" << top - 24 << "' width='12' height='12' fill='" << color(st) << "'/>"
      << "<text x='" << lx + 16 << "' y='" << top - 14 << "'>" << strategy_name(st) << "</text>\n";
    lx += 70;
  }
  s << "<rect x='" << lx << "' y='" << top - 24 << "' width='12' height='12' fill='#bab0ac'/><text x='"
    << lx + 16 << "' y='" << top - 14 << "'>transient</text>\n";
  lx += 80;
  s << "<rect x='" << lx << "' y='" << top - 24 << "' width='12' height='12' fill='#edc948'/><text x='"
    << lx + 16 << "' y='" << top - 14 << "'>activations</text>\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const int y = top + static_cast<int>(i) * row_h;
    double x = left;
    const double scale = bar_w / widest;
    s << "<text x='" << left - 8 << "' y='" << y + 13 << "' text-anchor='end'>" << xml_escape(r.label) << " — "
      << (r.mixed ? "mixed" : xml_escape(r.choice)) << "</text>\n";
    const double segs[3] = {r.persistent, r.transient, r.activations};
    const std::string fills[3] = {color(r.strategy), "#bab0ac", "#edc948"};
    for (int k = 0; k < 3; ++k) {
      const double w = segs[k] * scale;
      if (w <= 0) continue;
      s << "<rect x='" << num(x) << "' y='" << y + 2 << "' width='" << num(std::max(w, 0.5)) << "' height='"
        << row_h - 4 << "' fill='" << fills[k] << "'><title>" << xml_escape(r.label) << ": "
        << (k == 0   ? "persistent "
            : k == 1 ? "transient "
                     : "activations ")
        << num(segs[k] / mib, 2) << " MiB</title></rect>\n";
      x += w;
    }
    s << "<text x='" << num(x + 6) << "' y='" << y + 13 << "' fill='#555'>"
      << num((r.persistent + r.transient + r.activations) / mib) << " MiB</text>\n";
  }
  // Throughput.
  s << "<text x='20' y='" << thr_top << "' font-weight='bold'>Predicted throughput (tokens/s)</text>\n";
  std::vector<std::pair<std::string, SearchResult>> all{{"osdp plan", plan}};
  all.insert(all.end(), baselines.begin(), baselines.end());
  double fastest = 1;
  for (const auto& [name, r] : all) fastest = std::max(fastest, r.cost.tokens_per_s);
  for (size_t i = 0; i < all.size(); ++i) {
    const auto& [name, r] = all[i];
    const int y = thr_top + 16 + static_cast<int>(i) * 28;
    s << "<text x='" << left - 8 << "' y='" << y + 15 << "' text-anchor='end'>" << xml_escape(name) << "</text>\n";
    if (!r.fits) {
      s << "<text x='" << left << "' y='" << y + 15 << "' fill='#b00'>does not fit (needs "
        << num(r.cost.peak_bytes / mib) << " MiB)</text>\n";
      continue;
    }
    const double w = r.cost.tokens_per_s / fastest * (bar_w - 120);
    s << "<rect x='" << left << "' y='" << y << "' width='" << num(w) << "' height='20' fill='"
      << (i == 0 ? "#76b7b2" : "#9c9c9c") << "'/>\n<text x='" << num(left + w + 6) << "' y='" << y + 15
      << "'>" << num(r.cost.tokens_per_s, 0) << " (" << num(r.cost.tokens_per_s / plan.cost.tokens_per_s, 2)
      << "× plan), peak " << num(r.cost.peak_bytes / mib) << " MiB</text>\n";
  }
  s << "</svg>\n";
  return s.str();
}

}  // namespace slimshard
