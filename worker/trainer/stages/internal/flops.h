// Model FLOPs utilisation (MFU): the FLOPs a training step needs by the model's shape, against the
// device's dense peak. No LibTorch.
//
// FLOPs per trained token follow PaLM (Chowdhery et al. 2022, appendix B): 6·N for the matmuls of
// forward and backward, N the parameters a token passes through (every parameter but the input
// embedding table), plus 12·L·d·T for attention scores and values (L layers, d the width, T the
// sequence length). Activation recomputation is not counted (that would be hardware FLOPs
// utilisation), and the vision tower is counted as if every token passed through it, so for
// image-heavy batches the figure is an approximation.
#ifndef TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_FLOPS_H_
#define TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_FLOPS_H_

#include <cstdint>
#include <optional>
#include <string>

namespace trainctl::trainer {

struct ModelShape {
  int64_t parameters = 0;  // every parameter of the model
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
};

// Training FLOPs (forward + backward) per token at mean sequence length `seq_len`.
double TrainingFlopsPerToken(const ModelShape& shape, double seq_len);

enum class ComputePrecision { kHalf, kTf32, kFp32 };  // bf16/fp16, fp32 with TF32, plain fp32

// The dense peak FLOP/s of one device by its CUDA name (e.g. "NVIDIA H100 80GB HBM3"), from NVIDIA's
// data sheets; nullopt for a device not in the table (CPUs included).
std::optional<double> PeakFlopsForDevice(const std::string& device_name,
                                         ComputePrecision precision);

// The peak to use: `override_text` (the TRAINCTL_PEAK_FLOPS environment variable, FLOP/s per device)
// when set and positive, else the table. An override that is set but not a positive number is
// reported in `error` and ignored.
std::optional<double> PeakFlops(const char* override_text, const std::string& device_name,
                                ComputePrecision precision, std::string* error);

}  // namespace trainctl::trainer

#endif  // TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_FLOPS_H_
