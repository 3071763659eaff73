// Qwen2-VL image preprocessing, as Hugging Face's Qwen2VLImageProcessor does it: decode to RGB,
// smart_resize the sides to multiples of 28 within a pixel budget, resize with Pillow's BICUBIC
// (reproduced exactly for 8-bit RGB), rescale by 1/255, normalise with CLIP's mean and std, repeat
// the picture to 2 temporal frames and cut it into 14x14 patches flattened in HF's order.
//
// Everything here is a pure function of its arguments and safe to call from several threads.
#ifndef TRAINCTL_COMMON_DATA_IMAGE_PROCESSOR_H_
#define TRAINCTL_COMMON_DATA_IMAGE_PROCESSOR_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainctl::data {

inline constexpr int64_t kPatchSize = 14;
inline constexpr int64_t kMergeSize = 2;
inline constexpr int64_t kTemporalPatchSize = 2;
inline constexpr int64_t kResizeFactor = kPatchSize * kMergeSize;  // 28
// open-r1-multimodal's defaults: 4 and 16384 merged tokens of 28x28 pixels.
inline constexpr int64_t kDefaultMinPixels = 3136;
inline constexpr int64_t kDefaultMaxPixels = 12845056;

inline constexpr std::array<float, 3> kClipMean = {0.48145466f, 0.4578275f, 0.40821073f};
inline constexpr std::array<float, 3> kClipStd = {0.26862954f, 0.26130258f, 0.27577711f};

// 8-bit RGB, row-major, channels interleaved: pixels[(y * width + x) * 3 + c].
struct RgbImage {
  int32_t width = 0;
  int32_t height = 0;
  std::vector<uint8_t> pixels;
};

// Decodes a JPEG or PNG (or anything else stb_image reads) to RGB: grey is replicated, alpha is
// dropped as PIL's convert("RGB") drops it. JPEG goes through libjpeg-turbo with Pillow's settings
// (internal/jpeg_decode.h), so its pixels are Pillow's exactly. INVALID_ARGUMENT naming `source`
// when the bytes are not an image it can decode, or hold more pixels than Pillow opens (its
// decompression-bomb limit, 178956970). EXIF orientation is not applied (PIL's Image.open does not
// either).
absl::StatusOr<RgbImage> DecodeImage(absl::string_view bytes, absl::string_view source);

// Reads and decodes the file at `path`. NOT_FOUND when it cannot be read; otherwise as DecodeImage.
absl::StatusOr<RgbImage> ReadImageFile(const std::string& path);

// The image as PNG bytes (stb_image_write; deterministic for the same pixels). INTERNAL when the
// encoder fails.
absl::StatusOr<std::string> EncodePng(const RgbImage& image);

struct ResizedSize {
  int64_t height = 0;
  int64_t width = 0;
};

// HF's smart_resize: each side rounded (half to even, as Python's round) to a multiple of
// `factor`; when the area is then above `max_pixels` both sides are scaled by
// beta = sqrt(h * w / max_pixels) and floored to multiples of `factor` (never below `factor`), and
// when below `min_pixels` scaled by sqrt(min_pixels / (h * w)) and ceiled. INVALID_ARGUMENT when a
// side is shorter than `factor` or the aspect ratio exceeds 200, as HF raises.
absl::StatusOr<ResizedSize> SmartResize(int64_t height, int64_t width,
                                        int64_t factor = kResizeFactor,
                                        int64_t min_pixels = kDefaultMinPixels,
                                        int64_t max_pixels = kDefaultMaxPixels);

// Resizes as Pillow's Image.resize((width, height), Image.BICUBIC) does for an RGB image: separable
// cubic convolution with a = -0.5, the kernel widened by the scale when downscaling (antialias),
// coefficients in 22-bit fixed point, horizontal pass first, each pass rounded and clipped to 8
// bits. Returns a copy when the size is unchanged. `height` and `width` must be positive.
RgbImage ResizeBicubic(const RgbImage& image, int32_t height, int32_t width);

struct ImageProcessorOptions {
  int64_t min_pixels = kDefaultMinPixels;
  int64_t max_pixels = kDefaultMaxPixels;
};

struct ProcessedImage {
  // [grid_t * grid_h * grid_w, kPatchDim]. Patch order: (t, h / 2, w / 2, h % 2, w % 2) over the
  // patch grid, i.e. each 2x2 block of patches that the merger fuses is contiguous; within a
  // patch: (channel, frame, row, column).
  std::vector<float> pixel_values;
  std::array<int32_t, 3> grid_thw = {0, 0, 0};  // in patches

  int64_t num_patches() const { return int64_t{grid_thw[0]} * grid_thw[1] * grid_thw[2]; }
  // The <|image_pad|> tokens the image stands for in the text: one per merged 2x2 block.
  int64_t num_merged_tokens() const { return num_patches() / (kMergeSize * kMergeSize); }
};

// smart_resize, bicubic resize, rescale, normalise, 2 frames, patches. INVALID_ARGUMENT as
// SmartResize, or when min_pixels/max_pixels are not positive and ordered.
absl::StatusOr<ProcessedImage> PreprocessImage(const RgbImage& image,
                                               const ImageProcessorOptions& options = {});

// The value HF gives an 8-bit channel value after rescale and normalise (float32 arithmetic).
float NormalizedValue(uint8_t value, int channel);

}  // namespace trainctl::data

#endif  // TRAINCTL_COMMON_DATA_IMAGE_PROCESSOR_H_
