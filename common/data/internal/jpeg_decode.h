// JPEG decoding as Pillow does it, through the same library (libjpeg-turbo): Image.open(f)
// .convert("RGB") with Pillow's default decoder settings, which are libjpeg's — ISLOW integer IDCT,
// fancy (triangle-filter) chroma upsampling, block smoothing for progressive scans — so the pixels
// are Pillow's exactly. Grey is replicated to RGB; CMYK/YCCK (Adobe's inverted polarity when the
// file has an Adobe marker) is converted with Pillow's cmyk2rgb arithmetic.
#ifndef TRAINCTL_COMMON_DATA_INTERNAL_JPEG_DECODE_H_
#define TRAINCTL_COMMON_DATA_INTERNAL_JPEG_DECODE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/data/image_processor.h"

namespace trainctl::data::internal {

// Pillow's Image.MAX_IMAGE_PIXELS * 2: above it Image.open raises DecompressionBombError. Decoders
// refuse larger pictures before allocating them.
inline constexpr int64_t kMaxDecodedPixels = 178956970;

// True when `bytes` start with a JPEG SOI marker (FF D8 FF).
bool LooksLikeJpeg(absl::string_view bytes);

// INVALID_ARGUMENT naming `source` when the bytes are not a JPEG libjpeg decodes, are truncated
// (Pillow raises "image file is truncated" there too), or exceed kMaxDecodedPixels. Thread-safe.
absl::StatusOr<RgbImage> DecodeJpeg(absl::string_view bytes, absl::string_view source);

}  // namespace trainctl::data::internal

#endif  // TRAINCTL_COMMON_DATA_INTERNAL_JPEG_DECODE_H_
