// metrics.h — the JSON Lines metrics file a run writes (`--metrics`): one object per step, the summary last.
// Private to src/train; reading it back (curves, the summary) is in train.h.
#pragma once
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace slimshard {

class MetricsWriter {
 public:
  MetricsWriter() = default;
  // Throws UsageError if the file cannot be created.
  explicit MetricsWriter(const std::string& path);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  // One whole line per call, flushed, so a reader never sees half a record. A write that fails (a full disk)
  // is a RuntimeError naming the file: a run never goes on with its metrics silently cut off.
  void write(const nlohmann::json& record);

 private:
  std::string path_;
  FILE* f_ = nullptr;
};

}  // namespace slimshard
