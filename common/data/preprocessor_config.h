// A model directory's preprocessor_config.json read as transformers' Qwen2VLImageProcessor reads
// it for AutoProcessor.from_pretrained: the pixel bounds are `size` {"shortest_edge",
// "longest_edge"} when present, and the older top-level "min_pixels"/"max_pixels" override them.
#ifndef TRAINCTL_COMMON_DATA_PREPROCESSOR_CONFIG_H_
#define TRAINCTL_COMMON_DATA_PREPROCESSOR_CONFIG_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/data/image_processor.h"

namespace trainctl::data {

// `defaults` with what DIR/preprocessor_config.json sets; `defaults` unchanged when there is no
// such file. INVALID_ARGUMENT naming the file and the field when it is not JSON, a bound is not a
// positive integer, or min > max.
absl::StatusOr<ImageProcessorOptions> ReadPreprocessorConfig(const std::string& model_dir,
                                                             ImageProcessorOptions defaults = {});

}  // namespace trainctl::data

#endif  // TRAINCTL_COMMON_DATA_PREPROCESSOR_CONFIG_H_
