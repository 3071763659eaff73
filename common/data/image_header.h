// An image's size from its header alone, and the tokens the processor will make of it: what a
// server checks before it decodes anything. PNG's IHDR and JPEG's SOFn are read directly (a few
// bytes, whatever follows them); other formats DecodeImage reads go through stb_image's info call,
// which also reads only the header.
#ifndef TRAINCTL_COMMON_DATA_IMAGE_HEADER_H_
#define TRAINCTL_COMMON_DATA_IMAGE_HEADER_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/data/image_processor.h"

namespace trainctl::data {

struct ImageHeader {
  int64_t width = 0;
  int64_t height = 0;
};

// The width and height DecodeImage would give `bytes`, without decoding pixels. INVALID_ARGUMENT
// naming `source` when the header is not a PNG/JPEG header (or one stb_image knows), is cut
// short, or says a side is 0; the JPEG error names the marker it stopped at.
absl::StatusOr<ImageHeader> ReadImageHeader(absl::string_view bytes, absl::string_view source);

// The <|image_pad|> tokens PreprocessImage makes of a `height` x `width` image under `options`:
// (h / 28) * (w / 28) of smart_resize's sides. INVALID_ARGUMENT as SmartResize.
absl::StatusOr<int64_t> ImageTokenCount(int64_t height, int64_t width,
                                        const ImageProcessorOptions& options);

}  // namespace trainctl::data

#endif  // TRAINCTL_COMMON_DATA_IMAGE_HEADER_H_
