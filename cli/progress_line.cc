#include "cli/progress_line.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace trainctl::cli {
namespace {

// U+2588 full block, then U+2589..U+258F: seven to one eighths.
constexpr const char* kEighths[] = {"", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
constexpr char kFull[] = "█";

// The first `cells` code points of `s`.
std::string Cut(const std::string& s, size_t cells) {
  size_t seen = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if ((s[i] & 0xC0) != 0x80) {
      if (seen == cells) return s.substr(0, i);
      ++seen;
    }
  }
  return s;
}

}  // namespace

size_t DisplayWidth(const std::string& s) {
  return static_cast<size_t>(
      std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds)) return "-";
  const int64_t s = seconds <= 0 ? 0 : static_cast<int64_t>(std::llround(seconds));
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
  return absl::StrFormat("%dd%02dh", s / 86400, (s % 86400) / 3600);
}

std::string ProgressBar(double fraction, int width) {
  if (width <= 0) return "";
  if (!std::isfinite(fraction)) fraction = 0;
  fraction = std::clamp(fraction, 0.0, 1.0);
  const int eighths = static_cast<int>(std::floor(fraction * width * 8 + 1e-9));
  std::string bar;
  for (int i = 0; i < eighths / 8; ++i) bar += kFull;
  int cells = eighths / 8;
  if (cells < width && eighths % 8 > 0) {
    bar += kEighths[eighths % 8];
    ++cells;
  }
  bar.append(static_cast<size_t>(width - cells), ' ');
  return bar;
}

std::string FormatRate(double value) {
  if (!std::isfinite(value)) return "-";
  const double a = std::fabs(value);
  if (a >= 1e9) return absl::StrFormat("%.3gG", value / 1e9);
  if (a >= 1e6) return absl::StrFormat("%.3gM", value / 1e6);
  if (a >= 1e3) return absl::StrFormat("%.3gk", value / 1e3);
  return absl::StrFormat("%.3g", value);
}

std::string FormatProgressLine(const ProgressView& v, int width) {
  std::vector<std::string> head = {v.job_id, v.state};
  if (!v.stage.empty()) head.push_back(v.stage);
  std::string left = absl::StrJoin(head, " ");
  if (v.total_steps > 0) {
    absl::StrAppend(&left, "  step ", v.step, "/", v.total_steps);
  } else if (v.step > 0) {
    absl::StrAppend(&left, "  step ", v.step);
  }
  const bool has_bar = v.total_steps > 0;
  const double fraction =
      has_bar ? std::clamp(static_cast<double>(v.step) / v.total_steps, 0.0, 1.0) : 0;
  const std::string percent =
      has_bar ? absl::StrCat(" ", static_cast<int>(std::floor(fraction * 100)), "%") : "";
  // The figures after the bar, the first given up first when the line is too narrow.
  std::vector<std::string> optional;  // in order of display
  std::vector<size_t> give_up;        // indices into `optional`
  if (v.has_loss) optional.push_back(absl::StrFormat("loss %.4g", v.loss));
  const size_t loss = optional.size() - 1;
  if (v.tokens_per_second > 0) optional.push_back(FormatRate(v.tokens_per_second) + " tok/s");
  const size_t rate = optional.size() - 1;
  if (v.eta_seconds >= 0) optional.push_back("ETA " + FormatDuration(v.eta_seconds));
  if (v.elapsed_seconds >= 0) {
    optional.push_back("elapsed " + FormatDuration(v.elapsed_seconds));
    give_up.push_back(optional.size() - 1);
  }
  if (v.tokens_per_second > 0) give_up.push_back(rate);
  if (v.has_loss) give_up.push_back(loss);

  const size_t w = static_cast<size_t>(std::max(width, 1));
  std::vector<bool> shown(optional.size(), true);
  auto right = [&] {
    std::string out = percent;
    for (size_t i = 0; i < optional.size(); ++i) {
      if (shown[i]) absl::StrAppend(&out, "  ", optional[i]);
    }
    return out;
  };
  // The bar first: at most 30 cells, at least 10, with " ▕" and "▏" around it.
  const size_t plain = DisplayWidth(left) + DisplayWidth(right());
  if (has_bar && plain + 3 + 10 <= w) {
    const int bar = static_cast<int>(std::min<size_t>(30, w - plain - 3));
    return absl::StrCat(left, " ▕", ProgressBar(fraction, bar), "▏", right());
  }
  for (size_t i : give_up) {
    if (DisplayWidth(left) + DisplayWidth(right()) <= w) break;
    shown[i] = false;
  }
  return Cut(left + right(), w);
}

}  // namespace trainctl::cli
