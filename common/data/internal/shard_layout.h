// The byte layout of one shard file (little-endian):
//
//   header   16 B   "TCSHARD1", uint32 version = 2, uint32 patch dtype (0 float32, 1 bfloat16)
//   records         each at an 8-byte-aligned offset:
//                     uint32 num_tokens, num_images, num_patches, solution_bytes
//                     int32  input_ids[num_tokens], labels[num_tokens]
//                     int32  image_grid_thw[num_images * 3]
//                     patches[num_patches * 1176] as float32 or bfloat16
//                     solution[solution_bytes]: UTF-8, no terminator
//                     zero padding to a multiple of 8
//   index           uint64 offsets[num_samples + 1]: record starts, then the index's own offset
//   footer   24 B   uint64 num_samples, uint64 index offset, "TCSHEND1"
//
// Version 1 is the same with solution_bytes a reserved 0 and no solution: readers still accept it
// (every solution empty) and refuse a version-1 record whose reserved field is not 0.
//
// The footer carries the counts so a writer streams the file front to back and checksums it as
// it goes.
#ifndef TRAINCTL_COMMON_DATA_INTERNAL_SHARD_LAYOUT_H_
#define TRAINCTL_COMMON_DATA_INTERNAL_SHARD_LAYOUT_H_

#include <cstdint>
#include <cstring>

#include "common/data/batch.h"
#include "common/data/manifest.h"

namespace trainctl::data::internal {

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the shard format is little-endian and read in place"
#endif

inline constexpr char kShardMagic[8] = {'T', 'C', 'S', 'H', 'A', 'R', 'D', '1'};
inline constexpr char kShardEndMagic[8] = {'T', 'C', 'S', 'H', 'E', 'N', 'D', '1'};
inline constexpr uint32_t kShardVersion = 2;            // what writers write
inline constexpr uint32_t kShardVersionNoSolution = 1;  // oldest readers accept
inline constexpr uint64_t kShardHeaderBytes = 16;
inline constexpr uint64_t kShardFooterBytes = 24;
inline constexpr uint64_t kRecordAlign = 8;

struct RecordHeader {
  uint32_t num_tokens = 0;
  uint32_t num_images = 0;
  uint32_t num_patches = 0;
  uint32_t solution_bytes = 0;  // version 1: reserved, always 0
};
static_assert(sizeof(RecordHeader) == 16);

inline uint64_t PatchElementBytes(PatchDtype dtype) {
  return dtype == PatchDtype::kBfloat16 ? 2 : 4;
}

// Bytes of a record before its solution.
inline uint64_t RecordBytesBeforeSolution(const RecordHeader& h, PatchDtype dtype) {
  return sizeof(RecordHeader) + uint64_t{h.num_tokens} * 8 + uint64_t{h.num_images} * 12 +
         uint64_t{h.num_patches} * kPatchDim * PatchElementBytes(dtype);
}

// Bytes of a record before its padding.
inline uint64_t RecordBytes(const RecordHeader& h, PatchDtype dtype) {
  return RecordBytesBeforeSolution(h, dtype) + h.solution_bytes;
}

inline uint64_t AlignUp(uint64_t n) { return (n + kRecordAlign - 1) / kRecordAlign * kRecordAlign; }

// Round to nearest even; NaN stays NaN.
inline uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7FFFu + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

inline float Bf16ToFloat(uint16_t h) {
  const uint32_t bits = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace trainctl::data::internal

#endif  // TRAINCTL_COMMON_DATA_INTERNAL_SHARD_LAYOUT_H_
