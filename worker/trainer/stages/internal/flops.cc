#include "worker/trainer/stages/internal/flops.h"

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace trainctl::trainer {
namespace {

struct PeakRow {
  const char* name_part;  // matched against the CUDA device name, first match wins
  double half, tf32, fp32;  // dense TFLOP/s
};

// NVIDIA data sheets, dense (without 2:4 sparsity). More specific names come first.
constexpr PeakRow kPeaks[] = {
    {"H200 NVL", 835.5, 417.5, 60.0},  {"H200", 989.4, 494.7, 66.9},
    {"H100 NVL", 835.5, 417.5, 60.0},  {"H100 PCIe", 756.5, 378.0, 51.2},
    {"H100", 989.4, 494.7, 66.9},      {"H800", 989.4, 494.7, 66.9},
    {"A100", 312.0, 156.0, 19.5},      {"A800", 312.0, 156.0, 19.5},
    {"L40S", 362.05, 183.0, 91.6},     {"A10G", 70.0, 35.0, 31.2},
    {"A10", 125.0, 62.5, 31.2},
};

}  // namespace

double TrainingFlopsPerToken(const ModelShape& shape, double seq_len) {
  const double matmul_params =
      static_cast<double>(shape.parameters - shape.vocab_size * shape.hidden_size);
  return 6.0 * matmul_params + 12.0 * static_cast<double>(shape.num_layers) *
                                   static_cast<double>(shape.hidden_size) * seq_len;
}

std::optional<double> PeakFlopsForDevice(const std::string& device_name,
                                         ComputePrecision precision) {
  for (const PeakRow& row : kPeaks) {
    if (!absl::StrContains(device_name, row.name_part)) continue;
    const double tflops = precision == ComputePrecision::kHalf   ? row.half
                          : precision == ComputePrecision::kTf32 ? row.tf32
                                                                 : row.fp32;
    return tflops * 1e12;
  }
  return std::nullopt;
}

std::optional<double> PeakFlops(const char* override_text, const std::string& device_name,
                                ComputePrecision precision, std::string* error) {
  if (override_text != nullptr && *override_text != '\0') {
    double value = 0;
    if (absl::SimpleAtod(override_text, &value) && value > 0) return value;
    *error = absl::StrCat("TRAINCTL_PEAK_FLOPS='", override_text,
                          "' is not a positive number of FLOP/s per device; ignored");
  }
  return PeakFlopsForDevice(device_name, precision);
}

}  // namespace trainctl::trainer
