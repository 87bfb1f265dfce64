// progress.h — progress on stderr: one updating line on a terminal, plain periodic lines otherwise. Private
// to src/train.
#pragma once
#include <cstdint>
#include <string>

namespace slimshard {

class Progress {
 public:
  // `every`: plain-line period when stderr is not a terminal (0 = about 20 lines per run).
  Progress(int64_t total_steps, int64_t every, bool enabled);
  void step(int64_t step, const std::string& status, double step_s);
  // A message that must stay on screen (evaluation, warnings): clears the live line first.
  void message(const std::string& line);
  void finish();

 private:
  int64_t total_, every_;
  bool enabled_, tty_;
  bool live_ = false;
  double ema_step_s_ = 0;
};

std::string format_duration(double seconds);

}  // namespace slimshard
