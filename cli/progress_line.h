// Pure pieces of trainctl's live progress display (watch's redrawn line, ls's columns): durations,
// progress bars and the line itself. No I/O, no clock: the caller passes the time.
#ifndef TRAINCTL_CLI_PROGRESS_LINE_H_
#define TRAINCTL_CLI_PROGRESS_LINE_H_

#include <cstdint>
#include <string>

namespace trainctl::cli {

// "42s", "3m05s", "2h07m", "3d04h"; negative is "0s"; NaN or infinite is "-".
std::string FormatDuration(double seconds);

// A fixed-width bar of `width` cells (block characters, eighths for the partial cell):
// "██████▌   " for 0.65 and width 10. `fraction` is clamped to [0, 1].
std::string ProgressBar(double fraction, int width);

// Compact rates and counts: 950, 12.3k, 4.56M.
std::string FormatRate(double value);

// Display width in terminal cells of UTF-8 text (every code point one cell; no wide characters
// are used here).
size_t DisplayWidth(const std::string& s);

// What the live line shows; 0 / negative / empty means unknown, and that part is left out.
struct ProgressView {
  std::string job_id;
  std::string state;  // "running", "pending", ...
  std::string stage;  // a pipeline's current stage, e.g. "sft 1/3"
  int64_t step = 0;
  int64_t total_steps = 0;
  double loss = 0;
  bool has_loss = false;
  double tokens_per_second = 0;
  double eta_seconds = -1;      // < 0: unknown
  double elapsed_seconds = -1;  // < 0: not started
};

// One line, at most `width` cells (the terminal's width minus one, so it never wraps):
//   job-3 running  step 120/300 ▕██████▌     ▏ 40%  loss 0.3214  1.23k tok/s  ETA 2m05s  1m23s
// When the line is too narrow the bar shrinks (down to 10 cells) and goes first, then elapsed,
// tokens/s and loss, in that order; what still does not fit is cut at the end.
std::string FormatProgressLine(const ProgressView& view, int width);

}  // namespace trainctl::cli

#endif  // TRAINCTL_CLI_PROGRESS_LINE_H_
