#include "common/data/image_header.h"

#include <stb/stb_image.h>

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/data/internal/jpeg_decode.h"

namespace trainctl::data {
namespace {

constexpr absl::string_view kPngSignature("\x89PNG\r\n\x1a\n", 8);

uint32_t BigEndian32(absl::string_view bytes, size_t at) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data()) + at;
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

uint32_t BigEndian16(absl::string_view bytes, size_t at) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data()) + at;
  return (uint32_t{p[0]} << 8) | p[1];
}

absl::Status Bad(absl::string_view source, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", what));
}

// The signature, then the first chunk: length 13, "IHDR", width and height (big-endian, 1 to
// 2^31 - 1 as the PNG specification allows).
absl::StatusOr<ImageHeader> PngHeader(absl::string_view bytes, absl::string_view source) {
  if (bytes.size() < 24 || bytes.substr(12, 4) != "IHDR") {
    return Bad(source, "PNG without an IHDR chunk first");
  }
  const uint32_t width = BigEndian32(bytes, 16), height = BigEndian32(bytes, 20);
  if (width == 0 || height == 0 || width > uint32_t{std::numeric_limits<int32_t>::max()} ||
      height > uint32_t{std::numeric_limits<int32_t>::max()}) {
    return Bad(source, absl::StrCat("PNG header says ", width, "x", height, " pixels"));
  }
  return ImageHeader{width, height};
}

bool IsStartOfFrame(unsigned marker) {
  // SOF0-SOF15 but DHT (C4), JPG (C8) and DAC (CC).
  return marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
}

// Markers from SOI: each segment is FF, a marker and (but for RSTn, TEM) a 16-bit length that
// counts itself; the size is in the first SOFn (precision, height, width).
absl::StatusOr<ImageHeader> JpegHeader(absl::string_view bytes, absl::string_view source) {
  size_t at = 2;
  while (true) {
    while (at < bytes.size() && static_cast<unsigned char>(bytes[at]) == 0xFF) ++at;  // fill
    if (at >= bytes.size()) return Bad(source, "JPEG ends before its frame header (SOFn)");
    const unsigned marker = static_cast<unsigned char>(bytes[at++]);
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) continue;  // no length
    if (marker == 0xD9 || marker == 0xDA || at + 2 > bytes.size()) {
      return Bad(source,
                 absl::StrFormat("JPEG has no frame header (SOFn) before marker %02X", marker));
    }
    const size_t length = BigEndian16(bytes, at);
    if (length < 2 || at + length > bytes.size()) {
      return Bad(source, absl::StrFormat("JPEG segment %02X is cut short", marker));
    }
    if (IsStartOfFrame(marker)) {
      if (length < 7) return Bad(source, absl::StrFormat("JPEG SOF%X is too short", marker & 15));
      const uint32_t height = BigEndian16(bytes, at + 3), width = BigEndian16(bytes, at + 5);
      if (width == 0 || height == 0) {
        return Bad(source, absl::StrCat("JPEG frame header says ", width, "x", height, " pixels"));
      }
      return ImageHeader{width, height};
    }
    at += length;
  }
}

}  // namespace

absl::StatusOr<ImageHeader> ReadImageHeader(absl::string_view bytes, absl::string_view source) {
  if (bytes.substr(0, kPngSignature.size()) == kPngSignature) return PngHeader(bytes, source);
  if (internal::LooksLikeJpeg(bytes)) return JpegHeader(bytes, source);
  int width = 0, height = 0, channels = 0;
  const int length = static_cast<int>(
      std::min<size_t>(bytes.size(), static_cast<size_t>(std::numeric_limits<int>::max())));
  if (!stbi_info_from_memory(reinterpret_cast<const stbi_uc*>(bytes.data()), length, &width,
                             &height, &channels) ||
      width < 1 || height < 1) {
    return Bad(source, "not a PNG, JPEG or other image this server reads");
  }
  return ImageHeader{width, height};
}

absl::StatusOr<int64_t> ImageTokenCount(int64_t height, int64_t width,
                                        const ImageProcessorOptions& options) {
  absl::StatusOr<ResizedSize> size =
      SmartResize(height, width, kResizeFactor, options.min_pixels, options.max_pixels);
  if (!size.ok()) return size.status();
  return (size->height / kResizeFactor) * (size->width / kResizeFactor);
}

}  // namespace trainctl::data
