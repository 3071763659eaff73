#include "common/data/internal/bicubic_resize.h"

#include <algorithm>
#include <cmath>

namespace trainctl::data::internal {
namespace {

// Pillow keeps 8-bit coefficients in fixed point with this many fractional bits.
constexpr int kPrecisionBits = 32 - 8 - 2;
constexpr double kSupport = 2.0;  // the bicubic kernel is zero outside [-2, 2]

double BicubicKernel(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// For each output position: the first input index, how many inputs it reads, and their weights
// (`ksize` slots each).
struct Taps {
  int ksize = 0;
  std::vector<int> first;
  std::vector<int> count;
  std::vector<int32_t> weights;
};

// Pillow's precompute_coeffs + normalize_coeffs_8bpc for the box [0, in_size).
Taps ComputeTaps(int in_size, int out_size) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = kSupport * filter_scale;
  Taps taps;
  taps.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  taps.first.resize(out_size);
  taps.count.resize(out_size);
  taps.weights.assign(static_cast<size_t>(out_size) * taps.ksize, 0);
  std::vector<double> k(taps.ksize);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    const double inv = 1.0 / filter_scale;
    // C casts truncate toward zero; the clamps below make that the same as Pillow's.
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double total = 0.0;
    for (int x = 0; x < xmax; ++x) {
      k[x] = BicubicKernel((x + xmin - center + 0.5) * inv);
      total += k[x];
    }
    for (int x = 0; x < xmax; ++x) {
      if (total != 0.0) k[x] /= total;
      const double fixed = k[x] * (1 << kPrecisionBits);
      taps.weights[static_cast<size_t>(xx) * taps.ksize + x] =
          static_cast<int32_t>(fixed < 0 ? -0.5 + fixed : 0.5 + fixed);
    }
    taps.first[xx] = xmin;
    taps.count[xx] = xmax;
  }
  return taps;
}

uint8_t DescaleClip8(int32_t sum) {
  const int32_t v = sum >> kPrecisionBits;  // arithmetic shift: floor, as Pillow's lookup
  return static_cast<uint8_t>(std::clamp(v, 0, 255));
}

// Rows [row0, row0 + rows) of `src` resampled horizontally to `taps.first.size()` columns.
std::vector<uint8_t> Horizontal(const std::vector<uint8_t>& src, int in_width, int row0, int rows,
                                const Taps& taps) {
  const int out_width = static_cast<int>(taps.first.size());
  std::vector<uint8_t> out(static_cast<size_t>(rows) * out_width * 3);
  for (int y = 0; y < rows; ++y) {
    const uint8_t* line = &src[static_cast<size_t>(row0 + y) * in_width * 3];
    uint8_t* dst = &out[static_cast<size_t>(y) * out_width * 3];
    for (int xx = 0; xx < out_width; ++xx) {
      const int32_t* k = &taps.weights[static_cast<size_t>(xx) * taps.ksize];
      const uint8_t* p = line + static_cast<size_t>(taps.first[xx]) * 3;
      int32_t s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
      for (int x = 0; x < taps.count[xx]; ++x) {
        s0 += p[x * 3 + 0] * k[x];
        s1 += p[x * 3 + 1] * k[x];
        s2 += p[x * 3 + 2] * k[x];
      }
      dst[xx * 3 + 0] = DescaleClip8(s0);
      dst[xx * 3 + 1] = DescaleClip8(s1);
      dst[xx * 3 + 2] = DescaleClip8(s2);
    }
  }
  return out;
}

// `src` (width columns) resampled vertically; taps.first is relative to src's first row.
std::vector<uint8_t> Vertical(const std::vector<uint8_t>& src, int width, const Taps& taps) {
  const int out_height = static_cast<int>(taps.first.size());
  std::vector<uint8_t> out(static_cast<size_t>(out_height) * width * 3);
  const size_t stride = static_cast<size_t>(width) * 3;
  for (int yy = 0; yy < out_height; ++yy) {
    const int32_t* k = &taps.weights[static_cast<size_t>(yy) * taps.ksize];
    const uint8_t* base = &src[static_cast<size_t>(taps.first[yy]) * stride];
    uint8_t* dst = &out[static_cast<size_t>(yy) * stride];
    for (size_t i = 0; i < stride; ++i) {
      int32_t s = 1 << (kPrecisionBits - 1);
      for (int y = 0; y < taps.count[yy]; ++y) s += base[y * stride + i] * k[y];
      dst[i] = DescaleClip8(s);
    }
  }
  return out;
}

}  // namespace

std::vector<uint8_t> ResizeBicubicRgb(const std::vector<uint8_t>& src, int in_width, int in_height,
                                      int out_width, int out_height) {
  if (in_width == out_width && in_height == out_height) return src;
  const bool horizontal = in_width != out_width;
  const bool vertical = in_height != out_height;
  Taps vertical_taps = ComputeTaps(in_height, out_height);
  if (!horizontal) return Vertical(src, in_width, vertical_taps);
  // Only the rows the vertical pass reads go through the horizontal one, as in Pillow.
  const int row0 = vertical_taps.first.front();
  const int row_end = vertical_taps.first.back() + vertical_taps.count.back();
  const int rows = vertical ? row_end - row0 : in_height;
  std::vector<uint8_t> wide =
      Horizontal(src, in_width, vertical ? row0 : 0, rows, ComputeTaps(in_width, out_width));
  if (!vertical) return wide;
  for (int& first : vertical_taps.first) first -= row0;
  return Vertical(wide, out_width, vertical_taps);
}

}  // namespace trainctl::data::internal
