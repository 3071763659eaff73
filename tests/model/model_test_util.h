// Shared helpers for the model tests: the tiny registry config and token/pixel builders.
#ifndef TRAINCTL_TESTS_MODEL_MODEL_TEST_UTIL_H_
#define TRAINCTL_TESTS_MODEL_MODEL_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "worker/trainer/model/qwen2vl_config.h"

namespace trainctl::model::testing {

inline constexpr int64_t kVisionStart = 151652;
inline constexpr int64_t kVisionEnd = 151653;
inline constexpr int64_t kImagePad = 151655;

inline Qwen2VLConfig TinyConfig() {
  auto path = FindModelConfig("tiny");
  EXPECT_TRUE(path.ok()) << path.status();
  auto config = LoadQwen2VLConfig(*path);
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

// <|vision_start|>, `pads` x <|image_pad|>, <|vision_end|>.
inline std::vector<int64_t> ImageTokens(int64_t pads) {
  std::vector<int64_t> out = {kVisionStart};
  out.insert(out.end(), static_cast<size_t>(pads), kImagePad);
  out.push_back(kVisionEnd);
  return out;
}

inline std::vector<int64_t> Concat(std::initializer_list<std::vector<int64_t>> parts) {
  std::vector<int64_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// [rows, cols] int64 from equal-length rows.
inline torch::Tensor Ids(const std::vector<std::vector<int64_t>>& rows) {
  std::vector<int64_t> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  return torch::tensor(flat, torch::kInt64)
      .view({static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())});
}

// Random patches for images with the given (t, h, w) grids.
inline torch::Tensor RandomPixels(const std::vector<std::vector<int64_t>>& grids,
                                  int64_t patch_dim = 1176) {
  int64_t n = 0;
  for (const auto& g : grids) n += g[0] * g[1] * g[2];
  return torch::randn({n, patch_dim});
}

inline torch::Tensor Grid(const std::vector<std::vector<int64_t>>& grids) { return Ids(grids); }

// A copy of every gradient of `model` by parameter name (parameters without one left out), then
// the gradients zeroed for the next backward.
inline std::map<std::string, torch::Tensor> TakeGradients(torch::nn::Module& model) {
  std::map<std::string, torch::Tensor> grads;
  for (const auto& p : model.named_parameters()) {
    if (p.value().grad().defined()) grads[p.key()] = p.value().grad().clone();
  }
  model.zero_grad();
  return grads;
}

// A loss and the gradients it gave, by parameter name.
struct LossAndGrads {
  torch::Tensor loss;
  std::map<std::string, torch::Tensor> grads;
};

// HF's text keys in the order the model registers them: the embedding, each decoder layer, the
// final norm, the head unless tied (shared by the Qwen2-VL and Qwen2.5-VL key lists).
inline void AppendTextKeys(int64_t layers, bool tied, std::vector<std::string>* keys) {
  keys->push_back("model.embed_tokens.weight");
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* s :
         {"self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight",
          "self_attn.k_proj.bias", "self_attn.v_proj.weight", "self_attn.v_proj.bias",
          "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
          "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"}) {
      keys->push_back(p + s);
    }
  }
  keys->push_back("model.norm.weight");
  if (!tied) keys->push_back("lm_head.weight");
}

}  // namespace trainctl::model::testing

#endif  // TRAINCTL_TESTS_MODEL_MODEL_TEST_UTIL_H_
