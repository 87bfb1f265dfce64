// metrics.cpp — the metrics file: written one whole line at a time, read back as curves and as its summary
// (see metrics.h, train.h).
#include "metrics.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "slimshard/common.h"
#include "slimshard/json.h"
#include "slimshard/train.h"

namespace slimshard {

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {
  f_ = std::fopen(path.c_str(), "w");
  if (!f_) throw UsageError("--metrics " + path + ": cannot create (" + std::strerror(errno) + ")");
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (!f_) return;
  const std::string line = record.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fflush(f_) != 0)
    throw RuntimeError("--metrics " + path_ + ": cannot write (" + std::strerror(errno) + ")");
}

Curve metrics_curve(const std::string& spec, const std::string& x, const std::string& y, int mean_of) {
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
    const nlohmann::json j = parse_json(line, "plot: " + path + ":" + std::to_string(n));
    // Only step records: a summary line (any value of "summary" but false) or a line without a step is
    // skipped.
    if (!j.is_object() || (j.contains("summary") && j.at("summary") != false) || !j.contains("step"))
      continue;
    if (j.contains("comm_bytes") && j.at("comm_bytes").is_number()) bytes += j.at("comm_bytes").get<double>();
    if (!j.contains(y) || !j.at(y).is_number()) continue;
    if (!j.at("step").is_number())
      throw UsageError("plot: " + path + ":" + std::to_string(n) + ": step is not a number");
    c.points.emplace_back(x == "step" ? j.at("step").get<double>() : bytes / (1 << 20),
                          j.at(y).get<double>());
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

nlohmann::json metrics_summary(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  nlohmann::json last = nlohmann::json::object();
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("summary") && j.at("summary") == true) last = j;
  }
  return last;
}

}  // namespace slimshard
