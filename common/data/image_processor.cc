#include "common/data/image_processor.h"

#include <stb/stb_image.h>
#include <stb/stb_image_write.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/data/batch.h"
#include "common/data/internal/bicubic_resize.h"
#include "common/data/internal/jpeg_decode.h"

namespace trainctl::data {
namespace {

// HF's rescale_factor 1/255, applied in float64 and cast to float32 (image_transforms.rescale),
// then (x - mean) / std in float32 (image_transforms.normalize).
struct NormalizeTable {
  float values[3][256];
  NormalizeTable() {
    for (int c = 0; c < 3; ++c) {
      for (int v = 0; v < 256; ++v) {
        const float rescaled = static_cast<float>(static_cast<double>(v) * (1.0 / 255.0));
        values[c][v] = (rescaled - kClipMean[c]) / kClipStd[c];
      }
    }
  }
};

const NormalizeTable& Table() {
  static const NormalizeTable* const table = new NormalizeTable();
  return *table;
}

}  // namespace

float NormalizedValue(uint8_t value, int channel) { return Table().values[channel][value]; }

absl::StatusOr<RgbImage> DecodeImage(absl::string_view bytes, absl::string_view source) {
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": image file too large"));
  }
  // JPEG through libjpeg-turbo with Pillow's settings, so the pixels are Pillow's (stb_image's
  // IDCT and upsampling differ by a few levels); everything else through stb_image.
  if (internal::LooksLikeJpeg(bytes)) return internal::DecodeJpeg(bytes, source);
  int width = 0, height = 0, channels = 0;
  if (stbi_info_from_memory(reinterpret_cast<const stbi_uc*>(bytes.data()),
                            static_cast<int>(bytes.size()), &width, &height, &channels) &&
      int64_t{width} * height > internal::kMaxDecodedPixels) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": image of ", width, "x", height, " pixels is too large"));
  }
  stbi_uc* pixels =
      stbi_load_from_memory(reinterpret_cast<const stbi_uc*>(bytes.data()),
                            static_cast<int>(bytes.size()), &width, &height, &channels, 3);
  if (pixels == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": cannot decode image: ", stbi_failure_reason()));
  }
  RgbImage image;
  image.width = width;
  image.height = height;
  image.pixels.assign(pixels, pixels + static_cast<size_t>(width) * height * 3);
  stbi_image_free(pixels);
  return image;
}

absl::StatusOr<RgbImage> ReadImageFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read image ", path));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) return absl::NotFoundError(absl::StrCat("cannot read image ", path));
  return DecodeImage(bytes.str(), path);
}

absl::StatusOr<std::string> EncodePng(const RgbImage& image) {
  std::string png;
  auto append = [](void* context, void* data, int size) {
    static_cast<std::string*>(context)->append(static_cast<const char*>(data),
                                               static_cast<size_t>(size));
  };
  if (image.width < 1 || image.height < 1 ||
      image.pixels.size() != static_cast<size_t>(image.width) * image.height * 3 ||
      stbi_write_png_to_func(append, &png, image.width, image.height, 3, image.pixels.data(),
                             image.width * 3) == 0) {
    return absl::InternalError(
        absl::StrCat("cannot encode a ", image.width, "x", image.height, " image as PNG"));
  }
  return png;
}

absl::StatusOr<ResizedSize> SmartResize(int64_t height, int64_t width, int64_t factor,
                                        int64_t min_pixels, int64_t max_pixels) {
  if (factor < 1 || min_pixels < 1 || max_pixels < min_pixels) {
    return absl::InvalidArgumentError(absl::StrCat(
        "smart_resize: need factor >= 1 and 1 <= ", "min_pixels <= max_pixels, got factor ", factor,
        ", min_pixels ", min_pixels, ", max_pixels ", max_pixels));
  }
  if (height < factor || width < factor) {
    return absl::InvalidArgumentError(absl::StrCat(
        "image of ", width, "x", height, ": both sides must be at least ", factor, " pixels"));
  }
  const double h = static_cast<double>(height), w = static_cast<double>(width);
  if (std::max(h, w) / std::min(h, w) > 200) {
    return absl::InvalidArgumentError(
        absl::StrCat("image of ", width, "x", height, ": aspect ratio above 200"));
  }
  const double f = static_cast<double>(factor);
  // std::nearbyint rounds half to even under the default rounding mode, as Python's round().
  int64_t h_bar = static_cast<int64_t>(std::nearbyint(h / f)) * factor;
  int64_t w_bar = static_cast<int64_t>(std::nearbyint(w / f)) * factor;
  if (h_bar * w_bar > max_pixels) {
    const double beta = std::sqrt(h * w / static_cast<double>(max_pixels));
    h_bar = std::max(factor, static_cast<int64_t>(std::floor(h / beta / f)) * factor);
    w_bar = std::max(factor, static_cast<int64_t>(std::floor(w / beta / f)) * factor);
  } else if (h_bar * w_bar < min_pixels) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / (h * w));
    h_bar = static_cast<int64_t>(std::ceil(h * beta / f)) * factor;
    w_bar = static_cast<int64_t>(std::ceil(w * beta / f)) * factor;
  }
  return ResizedSize{h_bar, w_bar};
}

RgbImage ResizeBicubic(const RgbImage& image, int32_t height, int32_t width) {
  RgbImage out;
  out.width = width;
  out.height = height;
  out.pixels = internal::ResizeBicubicRgb(image.pixels, image.width, image.height, width, height);
  return out;
}

absl::StatusOr<ProcessedImage> PreprocessImage(const RgbImage& image,
                                               const ImageProcessorOptions& options) {
  auto size =
      SmartResize(image.height, image.width, kResizeFactor, options.min_pixels, options.max_pixels);
  if (!size.ok()) return size.status();
  if (size->height > std::numeric_limits<int32_t>::max() / 2 ||
      size->width > std::numeric_limits<int32_t>::max() / 2) {
    return absl::InvalidArgumentError("resized image too large");
  }
  const RgbImage resized =
      ResizeBicubic(image, static_cast<int32_t>(size->height), static_cast<int32_t>(size->width));

  const int64_t grid_h = size->height / kPatchSize, grid_w = size->width / kPatchSize;
  ProcessedImage out;
  out.grid_thw = {1, static_cast<int32_t>(grid_h), static_cast<int32_t>(grid_w)};
  out.pixel_values.resize(static_cast<size_t>(grid_h * grid_w * kPatchDim));
  const NormalizeTable& table = Table();
  const int64_t row_stride = int64_t{resized.width} * 3;
  float* dst = out.pixel_values.data();
  // HF: reshape to (t, T, c, h/2, 2, 14, w/2, 2, 14), permute (0, 3, 6, 4, 7, 2, 1, 5, 8).
  for (int64_t bh = 0; bh < grid_h / kMergeSize; ++bh) {
    for (int64_t bw = 0; bw < grid_w / kMergeSize; ++bw) {
      for (int64_t mh = 0; mh < kMergeSize; ++mh) {
        for (int64_t mw = 0; mw < kMergeSize; ++mw) {
          const int64_t y0 = (bh * kMergeSize + mh) * kPatchSize;
          const int64_t x0 = (bw * kMergeSize + mw) * kPatchSize;
          for (int c = 0; c < 3; ++c) {
            for (int64_t frame = 0; frame < kTemporalPatchSize; ++frame) {
              for (int64_t py = 0; py < kPatchSize; ++py) {
                const uint8_t* src = &resized.pixels[(y0 + py) * row_stride + x0 * 3 + c];
                for (int64_t px = 0; px < kPatchSize; ++px) *dst++ = table.values[c][src[px * 3]];
              }
            }
          }
        }
      }
    }
  }
  return out;
}

}  // namespace trainctl::data
