// Facts about models that the control plane needs before any weights are loaded: today, the hidden
// size that DeepSpeed's hidden-size "auto" values are computed from (as the HF Trainer does from
// model.config.hidden_size).
#ifndef TRAINCTL_COMMON_MODEL_CATALOG_H_
#define TRAINCTL_COMMON_MODEL_CATALOG_H_

#include <cstdint>
#include <optional>

#include "absl/strings/string_view.h"

namespace trainctl {

// The model's (text) hidden size: from `<model_name_or_path>/config.json` when that file exists
// here
// (`hidden_size`, or `text_config.hidden_size` in the newer layout), else from the built-in table
// of Qwen2-VL / Qwen2.5-VL hub ids (with or without the "Qwen/" owner). nullopt when unknown; the
// trainer then resolves the remaining "auto" values from the checkpoint it loads.
std::optional<int64_t> LookupHiddenSize(absl::string_view model_name_or_path);

}  // namespace trainctl

#endif  // TRAINCTL_COMMON_MODEL_CATALOG_H_
