// Pillow's BICUBIC resampling of 8-bit interleaved RGB (libImaging/Resample.c), reproduced so
// that prepared patches equal what HF's image processor gives for the same decoded pixels.
#ifndef TRAINCTL_COMMON_DATA_INTERNAL_BICUBIC_RESIZE_H_
#define TRAINCTL_COMMON_DATA_INTERNAL_BICUBIC_RESIZE_H_

#include <cstdint>
#include <vector>

namespace trainctl::data::internal {

// `src` holds in_height rows of in_width RGB pixels; returns out_height rows of out_width. All
// sizes must be positive.
std::vector<uint8_t> ResizeBicubicRgb(const std::vector<uint8_t>& src, int in_width, int in_height,
                                      int out_width, int out_height);

}  // namespace trainctl::data::internal

#endif  // TRAINCTL_COMMON_DATA_INTERNAL_BICUBIC_RESIZE_H_
