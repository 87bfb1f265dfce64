// progress.cpp — the progress line (see progress.h).
#include "progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace slimshard {

std::string format_duration(double s) {
  if (!(s >= 0) || s > 1e7) return "?";
  const auto t = static_cast<int64_t>(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", (long long)(t / 3600), (long long)(t / 60 % 60),
                  (long long)(t % 60));
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", (long long)(t / 60), (long long)(t % 60));
  return buf;
}

Progress::Progress(int64_t total_steps, int64_t every, bool enabled)
    : total_(total_steps), every_(every), enabled_(enabled), tty_(::isatty(STDERR_FILENO) != 0) {
  if (every_ <= 0) every_ = std::max<int64_t>(1, total_ / 20);
}

void Progress::step(int64_t step, const std::string& status, double step_s) {
  ema_step_s_ = ema_step_s_ == 0 ? step_s : 0.9 * ema_step_s_ + 0.1 * step_s;
  if (!enabled_) return;
  const int64_t done = step + 1;
  const std::string eta = format_duration(ema_step_s_ * static_cast<double>(total_ - done));
  char head[64];
  std::snprintf(head, sizeof head, "step %lld/%lld", (long long)done, (long long)total_);
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s | %s | ETA %s", head, status.c_str(), eta.c_str());
    live_ = true;
  } else if (done % every_ == 0 || done == total_ || done == 1) {
    std::fprintf(stderr, "%s | %s | ETA %s\n", head, status.c_str(), eta.c_str());
  }
  std::fflush(stderr);
}

void Progress::message(const std::string& line) {
  if (!enabled_) return;
  if (live_) std::fprintf(stderr, "\r\033[K");
  std::fprintf(stderr, "%s\n", line.c_str());
  live_ = false;
  std::fflush(stderr);
}

void Progress::finish() {
  if (enabled_ && live_) std::fprintf(stderr, "\n");
  live_ = false;
}

}  // namespace slimshard
