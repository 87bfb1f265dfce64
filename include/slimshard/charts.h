// charts.h — SVG pages readable in a browser without the terminal: a plan (memory per op by choice, the
// predicted throughput next to the uniform baselines) and line charts of curves (loss by step or by bytes).
// One palette for both.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "slimshard/search.h"

namespace slimshard {

// The i-th colour of the palette (cycles); strategies have fixed ones.
const char* palette(size_t i);
const char* strategy_color(Strategy s);

std::string plan_svg(const CostModel& model, const SearchResult& plan,
                     const std::vector<std::pair<std::string, SearchResult>>& baselines);

struct Curve {
  std::string label;
  std::vector<std::pair<double, double>> points;  // (x, y), in drawing order
};
// Every curve on one pair of axes, ticks at 1, 2 or 5 times a power of ten, a legend with each curve's last
// point. Curves must not be empty.
std::string line_chart(const std::vector<Curve>& curves, const std::string& title, const std::string& xlabel,
                       const std::string& ylabel);

}  // namespace slimshard
