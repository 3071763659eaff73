// Configs, safetensors files, and HF checkpoints in and out of the model (the forward tool:
// tests/model/forward_tool_test.cc).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/model/model_test_util.h"
#include "tests/testing/temp_dir.h"
#include "worker/trainer/model/qwen2vl.h"
#include "worker/trainer/model/qwen2vl_config.h"
#include "worker/trainer/model/safetensors.h"
#include "worker/trainer/model/state_dict_adapter.h"

namespace trainctl::model {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::trainctl::model::testing::Concat;
using ::trainctl::model::testing::Grid;
using ::trainctl::model::testing::Ids;
using ::trainctl::model::testing::ImageTokens;
using ::trainctl::model::testing::RandomPixels;
using ::trainctl::model::testing::TinyConfig;
using ::trainctl::testing::TempDir;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A safetensors file with a hand-written header and `data_bytes` bytes of data.
std::string RawSafetensors(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  out += header;
  out.append(data_bytes, '\x01');
  return out;
}

// ---------------------------------------------------------------------------------------------
// Config

TEST(ConfigTest, RegistryConfigs) {
  const Qwen2VLConfig tiny = TinyConfig();
  EXPECT_EQ(tiny.hidden_size, 64);
  EXPECT_EQ(tiny.num_key_value_heads, 2);
  EXPECT_EQ(tiny.mrope_section, (std::vector<int64_t>{2, 3, 3}));
  EXPECT_EQ(tiny.vocab_size, 151936);
  EXPECT_TRUE(tiny.tie_word_embeddings);
  EXPECT_EQ(tiny.vision.embed_dim, 32);
  EXPECT_EQ(tiny.vision.patch_dim(), 1176);
  EXPECT_EQ(tiny.image_token_id, 151655);

  auto two_b = LoadQwen2VLConfig(*FindModelConfig("Qwen/Qwen2-VL-2B-Instruct"));
  ASSERT_TRUE(two_b.ok()) << two_b.status();
  EXPECT_EQ(two_b->hidden_size, 1536);
  EXPECT_EQ(two_b->num_attention_heads, 12);
  EXPECT_EQ(two_b->vision.hidden_size, 1536);
  EXPECT_TRUE(two_b->tie_word_embeddings);

  auto seven_b = LoadQwen2VLConfig(*FindModelConfig("Qwen2-VL-7B-Instruct"));
  ASSERT_TRUE(seven_b.ok()) << seven_b.status();
  EXPECT_EQ(seven_b->hidden_size, 3584);
  EXPECT_EQ(seven_b->vocab_size, 152064);
  EXPECT_EQ(seven_b->mrope_section, (std::vector<int64_t>{16, 24, 24}));
  EXPECT_FALSE(seven_b->tie_word_embeddings);

  EXPECT_EQ(FindModelConfig("no-such-model").status().code(), absl::StatusCode::kNotFound);
}

TEST(ConfigTest, NewerTextConfigLayout) {
  nlohmann::json flat = nlohmann::json::parse(ReadAll(*FindModelConfig("tiny")));
  nlohmann::json nested = {{"model_type", "qwen2_vl"},
                           {"image_token_id", 151655},
                           {"vision_config", flat["vision_config"]},
                           {"text_config", flat}};
  nested["text_config"].erase("vision_config");
  auto config = ParseQwen2VLConfig(nested.dump(), "nested.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->hidden_size, 64);
  EXPECT_EQ(config->mrope_section, (std::vector<int64_t>{2, 3, 3}));
  EXPECT_TRUE(config->tie_word_embeddings);

  // Saving writes the flat layout, which parses to the same values.
  auto again = ParseQwen2VLConfig(Qwen2VLConfigToJson(*config), "again.json");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->num_hidden_layers, 2);
  EXPECT_EQ(again->vision.depth, 2);
}

TEST(ConfigTest, ErrorsNameTheKeyAndFile) {
  nlohmann::json flat = nlohmann::json::parse(ReadAll(*FindModelConfig("tiny")));
  nlohmann::json missing = flat;
  missing.erase("num_key_value_heads");
  auto a = ParseQwen2VLConfig(missing.dump(), "my/config.json");
  EXPECT_THAT(a.status().message(),
              AllOf(HasSubstr("num_key_value_heads"), HasSubstr("my/config.json")));

  nlohmann::json wrong_type = flat;
  wrong_type["vision_config"]["depth"] = "two";
  auto b = ParseQwen2VLConfig(wrong_type.dump(), "c.json");
  EXPECT_THAT(b.status().message(), HasSubstr("vision_config.depth"));

  nlohmann::json bad_rope = flat;
  bad_rope["rope_scaling"]["mrope_section"] = {2, 2, 2};
  auto c = ParseQwen2VLConfig(bad_rope.dump(), "c.json");
  EXPECT_THAT(c.status().message(), AllOf(HasSubstr("mrope_section"), HasSubstr("8")));
}

// ---------------------------------------------------------------------------------------------
// Safetensors

TEST(SafetensorsTest, RoundTripDtypesAndZeroCopy) {
  TempDir dir;
  const std::string path = dir.path() + "/t.safetensors";
  const torch::Tensor f32 = torch::randn({3, 4});
  const torch::Tensor bf16 = torch::randn({5}).to(torch::kBFloat16);
  const torch::Tensor f16 = torch::randn({2, 2}).to(torch::kFloat16);
  const torch::Tensor i64 = torch::arange(6, torch::kInt64).view({2, 3});
  const torch::Tensor i32 = torch::arange(3, torch::kInt32);
  const torch::Tensor empty = torch::zeros({0, 4});
  ASSERT_TRUE(WriteSafetensors(path,
                               {{"f32", f32},
                                {"bf16", bf16},
                                {"f16", f16},
                                {"i64", i64},
                                {"i32", i32},
                                {"empty", empty}},
                               {{"note", "hello"}})
                  .ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->names(),
            (std::vector<std::string>{"bf16", "empty", "f16", "f32", "i32", "i64"}));
  EXPECT_EQ((*file)->metadata().at("note"), "hello");
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  EXPECT_EQ((*file)->Find("bf16")->dtype, "BF16");

  EXPECT_TRUE(torch::equal(*(*file)->Get("f32"), f32));
  EXPECT_TRUE(torch::equal(*(*file)->Get("bf16"), bf16));
  EXPECT_TRUE(torch::equal(*(*file)->Get("f16"), f16));
  EXPECT_TRUE(torch::equal(*(*file)->Get("i64"), i64));
  EXPECT_TRUE(torch::equal(*(*file)->Get("i32"), i32));
  EXPECT_EQ((*file)->Get("empty")->sizes(), torch::IntArrayRef({0, 4}));
  EXPECT_TRUE(torch::equal(*(*file)->Get("bf16", torch::kFloat32), bf16.to(torch::kFloat32)));

  // Views into one mapping: the same bytes each time, and alive after the file object is gone.
  torch::Tensor view = *(*file)->Get("f32");
  EXPECT_EQ(view.data_ptr(), (*file)->Get("f32")->data_ptr());
  file->reset();
  EXPECT_TRUE(torch::equal(view, f32));
  view.add_(1.0);  // copy-on-write: the file stays as written
  auto reopened = SafetensorsFile::Open(path);
  EXPECT_TRUE(torch::equal(*(*reopened)->Get("f32"), f32));

  auto missing = (*reopened)->Get("nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), AllOf(HasSubstr("nope"), HasSubstr(path)));
}

TEST(SafetensorsTest, CorruptHeadersAreRejected) {
  TempDir dir;
  struct Case {
    std::string name;
    std::string contents;
    std::string expect;  // in the message, besides the path
  };
  const std::vector<Case> cases = {
      {"short", std::string("\x05\x00", 2), "truncated"},
      {"header_past_end", RawSafetensors(R"({"a":1})", 0).substr(0, 10), "truncated"},
      {"not_json", RawSafetensors("{nope", 0), "JSON"},
      {"size_mismatch",
       RawSafetensors(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 12),
       "tensor w"},
      {"overlap",
       RawSafetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                      12),
       "tensor b"},
      {"gap", RawSafetensors(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
       "tensor a"},
      {"trailing", RawSafetensors(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8),
       "after the last tensor"},
      {"truncated_data",
       RawSafetensors(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                      R"("big":{"dtype":"F32","shape":[4],"data_offsets":[4,20]}})",
                      10),
       "tensor big"},
      {"dtype", RawSafetensors(R"({"q":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})", 1),
       "tensor q"},
      {"negative_shape",
       RawSafetensors(R"({"n":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), "tensor n"},
  };
  for (const Case& c : cases) {
    const std::string path = dir.Write(c.name + ".safetensors", c.contents);
    auto file = SafetensorsFile::Open(path);
    ASSERT_FALSE(file.ok()) << c.name;
    EXPECT_THAT(file.status().message(), AllOf(HasSubstr(path), HasSubstr(c.expect))) << c.name;
  }
  EXPECT_EQ(SafetensorsFile::Open(dir.path() + "/absent.safetensors").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(SafetensorsTest, ShardedCheckpoint) {
  TempDir dir;
  std::vector<NamedTensor> tensors;
  for (int i = 0; i < 5; ++i) {
    tensors.push_back({"t" + std::to_string(i), torch::full({256}, static_cast<float>(i))});
  }
  ShardingOptions sharding;
  sharding.max_shard_bytes = 2048;  // two 1 KiB tensors per shard
  ASSERT_TRUE(WriteSafetensorsCheckpoint(dir.path(), tensors, sharding).ok());
  EXPECT_FALSE(fs::exists(dir.path() + "/model.safetensors"));
  EXPECT_TRUE(fs::exists(dir.path() + "/model-00003-of-00003.safetensors"));
  const auto index = nlohmann::json::parse(ReadAll(dir.path() + "/model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], 5 * 1024);
  EXPECT_EQ(index["weight_map"]["t4"], "model-00003-of-00003.safetensors");

  auto ckpt = SafetensorsCheckpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->names().size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(torch::equal(*(*ckpt)->Get("t" + std::to_string(i)), tensors[i].tensor));
  }
  EXPECT_THAT((*ckpt)->FileOf("t2"), HasSubstr("model-00002-of-00003.safetensors"));

  // An index that lists a tensor its shard does not hold.
  nlohmann::json broken = index;
  broken["weight_map"]["t0"] = "model-00003-of-00003.safetensors";
  dir.Write("model.safetensors.index.json", broken.dump());
  auto bad = SafetensorsCheckpoint::Open(dir.path());
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(),
              AllOf(HasSubstr("tensor t0"), HasSubstr("model-00003-of-00003.safetensors")));

  // Rewriting as one file removes the index, so the old shards cannot be picked up.
  ASSERT_TRUE(WriteSafetensorsCheckpoint(dir.path(), tensors).ok());
  EXPECT_FALSE(fs::exists(dir.path() + "/model.safetensors.index.json"));
  EXPECT_TRUE(SafetensorsCheckpoint::Open(dir.path()).ok());
}

// ---------------------------------------------------------------------------------------------
// HF checkpoints

class CheckpointTest : public ::testing::Test {
 protected:
  CheckpointTest() {
    torch::manual_seed(7);
    model_ = std::make_shared<Qwen2VLForConditionalGeneration>(TinyConfig());
    model_->eval();
    const auto row = Concat({{10, 11}, ImageTokens(1), {12, 13}});
    inputs_ = {Ids({row}), {}, RandomPixels({{1, 2, 2}}), Grid({{1, 2, 2}})};
  }

  torch::Tensor Logits(Qwen2VLForConditionalGeneration& model) {
    torch::NoGradGuard no_grad;
    return model.forward(inputs_);
  }

  // A fresh model with other random weights.
  std::shared_ptr<Qwen2VLForConditionalGeneration> Fresh() {
    torch::manual_seed(99);
    auto m = std::make_shared<Qwen2VLForConditionalGeneration>(TinyConfig());
    m->eval();
    return m;
  }

  // The saved tensors, edited, written back as model.safetensors in `dir`.
  std::string Rewrite(const std::string& from_dir, const std::string& dir,
                      const std::function<void(std::vector<NamedTensor>*)>& edit) {
    auto file = SafetensorsFile::Open(from_dir + "/model.safetensors");
    EXPECT_TRUE(file.ok()) << file.status();
    std::vector<NamedTensor> tensors;
    for (const std::string& name : (*file)->names()) {
      tensors.push_back({name, (*file)->Get(name)->clone()});
    }
    edit(&tensors);
    const std::string path = dir + "/model.safetensors";
    EXPECT_TRUE(WriteSafetensors(path, tensors).ok());
    return path;
  }

  std::shared_ptr<Qwen2VLForConditionalGeneration> model_;
  ModelInputs inputs_;
};

TEST_F(CheckpointTest, SaveThenLoadGivesIdenticalLogits) {
  TempDir dir;
  ASSERT_TRUE(SaveHfCheckpoint(*model_, dir.path()).ok());
  EXPECT_TRUE(fs::exists(dir.path() + "/config.json"));

  // The file holds exactly the model's keys (no lm_head: tied).
  auto file = SafetensorsFile::Open(dir.path() + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<std::string> keys;
  for (const auto& item : model_->named_parameters()) keys.push_back(item.key());
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ((*file)->names(), keys);

  auto other = Fresh();
  ASSERT_FALSE(torch::equal(Logits(*other), Logits(*model_)));
  const absl::Status loaded = LoadHfCheckpoint(*other, dir.path());
  ASSERT_TRUE(loaded.ok()) << loaded;
  EXPECT_TRUE(torch::equal(Logits(*other), Logits(*model_)));

  auto from_dir = LoadHfModel(dir.path());
  ASSERT_TRUE(from_dir.ok()) << from_dir.status();
  (*from_dir)->eval();
  EXPECT_TRUE(torch::equal(Logits(**from_dir), Logits(*model_)));
}

TEST_F(CheckpointTest, ShardedAndBf16Saves) {
  TempDir dir;
  SaveOptions options;
  options.sharding.max_shard_bytes = 8 << 20;  // the 39 MB embedding gets a shard of its own
  ASSERT_TRUE(SaveHfCheckpoint(*model_, dir.path(), options).ok());
  ASSERT_TRUE(fs::exists(dir.path() + "/model.safetensors.index.json"));
  auto other = Fresh();
  ASSERT_TRUE(LoadHfCheckpoint(*other, dir.path()).ok());
  EXPECT_TRUE(torch::equal(Logits(*other), Logits(*model_)));

  TempDir bf16_dir;
  SaveOptions bf16;
  bf16.dtype = torch::kBFloat16;
  ASSERT_TRUE(SaveHfCheckpoint(*model_, bf16_dir.path(), bf16).ok());
  auto file = SafetensorsFile::Open(bf16_dir.path() + "/model.safetensors");
  EXPECT_EQ((*file)->Find("model.norm.weight")->dtype, "BF16");
  EXPECT_THAT(ReadAll(bf16_dir.path() + "/config.json"), HasSubstr("\"bfloat16\""));
  auto loaded = Fresh();
  ASSERT_TRUE(LoadHfCheckpoint(*loaded, bf16_dir.path()).ok());
  EXPECT_TRUE(torch::allclose(Logits(*loaded), Logits(*model_), 0.05, 0.01));
}

TEST_F(CheckpointTest, LanguageModelLayoutLoads) {
  TempDir saved, renamed;
  ASSERT_TRUE(SaveHfCheckpoint(*model_, saved.path()).ok());
  Rewrite(saved.path(), renamed.path(), [](std::vector<NamedTensor>* tensors) {
    for (NamedTensor& t : *tensors) {
      if (t.name.rfind("model.", 0) == 0) {
        t.name = "model.language_model." + t.name.substr(6);
      } else if (t.name.rfind("visual.", 0) == 0) {
        t.name = "model.visual." + t.name.substr(7);
      }
    }
  });
  EXPECT_EQ(ToModelKey("model.language_model.layers.0.mlp.up_proj.weight"),
            "model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(ToModelKey("model.visual.merger.mlp.0.bias"), "visual.merger.mlp.0.bias");
  auto other = Fresh();
  const absl::Status loaded = LoadHfCheckpoint(*other, renamed.path());
  ASSERT_TRUE(loaded.ok()) << loaded;
  EXPECT_TRUE(torch::equal(Logits(*other), Logits(*model_)));
}

TEST_F(CheckpointTest, MismatchesNameTensorAndFile) {
  TempDir saved;
  ASSERT_TRUE(SaveHfCheckpoint(*model_, saved.path()).ok());

  {
    TempDir dir;
    const std::string path = Rewrite(saved.path(), dir.path(), [](auto* tensors) {
      for (NamedTensor& t : *tensors) {
        if (t.name == "model.layers.1.mlp.up_proj.weight") t.tensor = torch::zeros({64, 64});
      }
    });
    const absl::Status s = LoadHfCheckpoint(*Fresh(), dir.path());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), AllOf(HasSubstr("model.layers.1.mlp.up_proj.weight"), HasSubstr(path),
                                   HasSubstr("[64, 64]"), HasSubstr("[128, 64]")));
  }
  {
    TempDir dir;
    const std::string path = Rewrite(saved.path(), dir.path(), [](auto* tensors) {
      tensors->erase(
          std::remove_if(tensors->begin(), tensors->end(),
                         [](const NamedTensor& t) { return t.name == "model.norm.weight"; }),
          tensors->end());
    });
    const absl::Status s = LoadHfCheckpoint(*Fresh(), dir.path());
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
    EXPECT_THAT(s.message(), AllOf(HasSubstr("model.norm.weight"), HasSubstr(path)));
  }
  {
    TempDir dir;
    const std::string path = Rewrite(saved.path(), dir.path(), [](auto* tensors) {
      tensors->push_back({"model.layers.0.extra.weight", torch::zeros({2})});
    });
    const absl::Status s = LoadHfCheckpoint(*Fresh(), dir.path());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), AllOf(HasSubstr("model.layers.0.extra.weight"), HasSubstr(path)));
  }
  {
    // Truncated: the last bytes of the file are gone.
    TempDir dir;
    const std::string path = dir.path() + "/model.safetensors";
    fs::copy_file(saved.path() + "/model.safetensors", path);
    fs::resize_file(path, fs::file_size(path) - 100);
    const absl::Status s = LoadHfCheckpoint(*Fresh(), dir.path());
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(s.message(), AllOf(HasSubstr("tensor "), HasSubstr(path), HasSubstr("truncated")));
  }
  {
    // A tied model ignores a stray lm_head.weight; an untied one requires it.
    TempDir dir;
    Rewrite(saved.path(), dir.path(), [](auto* tensors) {
      tensors->push_back({"lm_head.weight", torch::zeros({151936, 64})});
    });
    EXPECT_TRUE(LoadHfCheckpoint(*Fresh(), dir.path()).ok());
    Qwen2VLConfig untied = TinyConfig();
    untied.tie_word_embeddings = false;
    Qwen2VLForConditionalGeneration untied_model(untied);
    const absl::Status s = LoadHfCheckpoint(untied_model, saved.path());
    EXPECT_THAT(s.message(), HasSubstr("lm_head.weight"));
  }
}

}  // namespace
}  // namespace trainctl::model
