#include "worker/trainer/model/forward_tool.h"

#include <torch/torch.h>

#include "absl/strings/str_cat.h"

namespace trainctl::model {

absl::StatusOr<ForwardOptions> ParseForwardOptions(const std::string& device,
                                                   const std::string& dtype,
                                                   const std::string& attention) {
  ForwardOptions options;
  if (!device.empty()) {
    try {
      options.device = torch::Device(device);
    } catch (const c10::Error&) {
      return absl::InvalidArgumentError(
          absl::StrCat("--device: expected cpu or cuda[:N], got '", device, "'"));
    }
    if (options.device.is_cuda() && !torch::cuda::is_available()) {
      return absl::FailedPreconditionError(
          absl::StrCat("--device ", device, ": this machine or build has no CUDA device"));
    }
  }
  if (dtype == "bfloat16" || dtype == "bf16") {
    options.dtype = torch::kBFloat16;
  } else if (!dtype.empty() && dtype != "float32" && dtype != "fp32") {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype: expected float32 or bfloat16, got '", dtype, "'"));
  }
  if (!attention.empty()) {
    auto impl = ParseAttentionImpl(attention);
    if (!impl.ok()) return impl.status();
    options.attention = *impl;
  }
  return options;
}

}  // namespace trainctl::model
