// Image decoding (common/data/image_processor.h): JPEG through libjpeg-turbo, PNG and the
// rest through stb_image. A small picture that decodes also goes through Qwen2-VL's preprocessing
// (smart_resize, bicubic resize, patches) with a small pixel budget.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "common/data/image_processor.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto image = trainctl::data::DecodeImage(
      absl::string_view(reinterpret_cast<const char*>(data), size), "fuzz.img");
  if (!image.ok()) return 0;
  if (image->width <= 0 || image->height <= 0 ||
      image->pixels.size() != static_cast<size_t>(image->width) * image->height * 3) {
    std::abort();  // a decoded image must be what it says it is
  }
  if (int64_t{image->width} * image->height > 64 * 64) return 0;
  trainctl::data::ImageProcessorOptions options;
  options.min_pixels = 28 * 28;
  options.max_pixels = 56 * 56;
  (void)trainctl::data::PreprocessImage(*image, options);
  return 0;
}
