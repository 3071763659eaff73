// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, initial value and final xor 0xFFFFFFFF),
// the checksum of prepared shards. Uses SSE4.2's crc32 instruction where the CPU has it, a
// slicing-by-8 table otherwise; both give the same values.
#ifndef TRAINCTL_COMMON_DATA_INTERNAL_CRC32C_H_
#define TRAINCTL_COMMON_DATA_INTERNAL_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace trainctl::data::internal {

// Extends `crc` (the value returned for the bytes before; 0 for none) by `size` bytes at `data`.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);

inline uint32_t Crc32c(const void* data, size_t size) { return Crc32cExtend(0, data, size); }

// The portable path alone, so tests can check the two against each other.
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t size);

}  // namespace trainctl::data::internal

#endif  // TRAINCTL_COMMON_DATA_INTERNAL_CRC32C_H_
