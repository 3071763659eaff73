#include "cli/chart.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace trainctl::cli {
namespace {

// The braille dot bit of column dx (0..1) and row dy (0..3) of a cell (Unicode's dot numbering:
// 1 2 3 7 down the left column, 4 5 6 8 down the right).
constexpr uint8_t kDotBits[2][4] = {{0x01, 0x02, 0x04, 0x40}, {0x08, 0x10, 0x20, 0x80}};

std::string Utf8(uint32_t cp) {
  std::string s;
  s += static_cast<char>(0xE0 | (cp >> 12));
  s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
  s += static_cast<char>(0x80 | (cp & 0x3F));
  return s;
}

class DotGrid {
 public:
  DotGrid(int cols, int rows) : cols_(cols), rows_(rows), cells_(cols * rows, 0) {}
  int dot_cols() const { return cols_ * 2; }
  int dot_rows() const { return rows_ * 4; }

  void Set(int x, int y) {
    if (x < 0 || y < 0 || x >= dot_cols() || y >= dot_rows()) return;
    cells_[(y / 4) * cols_ + x / 2] |= kDotBits[x % 2][y % 4];
  }
  // Bresenham's line between two dots, both ends included.
  void Line(int x0, int y0, int x1, int y1) {
    const int dx = std::abs(x1 - x0), sx = x0 < x1 ? 1 : -1;
    const int dy = -std::abs(y1 - y0), sy = y0 < y1 ? 1 : -1;
    int err = dx + dy;
    while (true) {
      Set(x0, y0);
      if (x0 == x1 && y0 == y1) return;
      const int e2 = 2 * err;
      if (e2 >= dy) {
        err += dy;
        x0 += sx;
      }
      if (e2 <= dx) {
        err += dx;
        y0 += sy;
      }
    }
  }
  // Row `r` of cells; an empty cell is a space, so copied text has no blank braille in it.
  std::string Row(int r) const {
    std::string out;
    for (int c = 0; c < cols_; ++c) {
      const uint8_t bits = cells_[r * cols_ + c];
      out += bits == 0 ? " " : Utf8(0x2800 + bits);
    }
    return out;
  }

 private:
  int cols_, rows_;
  std::vector<uint8_t> cells_;
};

std::string Number(double v) { return absl::StrFormat("%.4g", v); }

// Steps are whole numbers: printed whole, however large.
std::string XNumber(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return absl::StrCat(static_cast<int64_t>(v));
  return Number(v);
}

}  // namespace

std::string RenderChart(const std::vector<std::pair<double, double>>& points,
                        const ChartOptions& options) {
  const int width = std::max(options.width, 2);
  const int height = std::max(options.height, 2);
  double x_min = 0, x_max = 0, y_min = 0, y_max = 0;
  bool any = false;
  for (const auto& [x, y] : points) {
    if (!std::isfinite(x) || !std::isfinite(y)) continue;
    if (!any) {
      x_min = x_max = x;
      y_min = y_max = y;
      any = true;
    }
    x_min = std::min(x_min, x);
    x_max = std::max(x_max, x);
    y_min = std::min(y_min, y);
    y_max = std::max(y_max, y);
  }
  if (!any) return "";
  DotGrid grid(width, height);
  auto dot_x = [&](double x) {
    if (x_max == x_min) return 0;
    return static_cast<int>(std::lround((x - x_min) / (x_max - x_min) * (grid.dot_cols() - 1)));
  };
  auto dot_y = [&](double y) {  // 0 is the top row
    if (y_max == y_min) return grid.dot_rows() / 2;
    return static_cast<int>(std::lround((y_max - y) / (y_max - y_min) * (grid.dot_rows() - 1)));
  };
  bool have_previous = false;
  int px = 0, py = 0;
  for (const auto& [x, y] : points) {
    if (!std::isfinite(x) || !std::isfinite(y)) {
      have_previous = false;
      continue;
    }
    const int cx = dot_x(x), cy = dot_y(y);
    if (have_previous) {
      grid.Line(px, py, cx, cy);
    } else {
      grid.Set(cx, cy);
    }
    px = cx;
    py = cy;
    have_previous = true;
  }
  const std::string top = Number(y_max), bottom = Number(y_min);
  const size_t label = std::max(top.size(), bottom.size());
  std::string out;
  for (int r = 0; r < height; ++r) {
    std::string name = r == 0 ? top : (r == height - 1 ? bottom : "");
    name.insert(0, label - name.size(), ' ');
    absl::StrAppend(&out, name, (r == 0 || r == height - 1) ? " ┤" : " │", grid.Row(r), "\n");
  }
  std::string axis(label + 1, ' ');
  axis += "└";
  for (int c = 0; c < width; ++c) axis += "─";
  absl::StrAppend(&out, axis, "\n");
  const std::string first = XNumber(x_min), last = XNumber(x_max);
  std::string xs(label + 2, ' ');
  xs += first;
  const size_t end = label + 2 + static_cast<size_t>(width);  // the column after the plot's last
  if (xs.size() + 1 + last.size() <= end) {
    xs.append(end - xs.size() - last.size(), ' ');
  } else {
    xs += ' ';
  }
  absl::StrAppend(&out, xs, x_max == x_min ? "" : last, "\n");
  return out;
}

}  // namespace trainctl::cli
