// SFT with the real parts: the shapes dataset made by `trainctl datagen`, shards made by
// `trainctl prepare` with the real Qwen tokenizer, and the real trainctl-trainer binary training
// the tiny Qwen2-VL config on one rank.
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/trainer/shapes_fixture.h"

namespace trainctl {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::RunResult;

using testing::Losses;
using testing::ReadEvents;

class SftTest : public testing::ShapesTrainingTest {};

TEST_F(SftTest, LossFallsBelowThresholdOnTheShapesDataset) {
  const std::string events = dir_.path() + "/learn.jsonl";
  RunResult r = testing::Run(
      TrainArgs(WriteSpec("learn", dir_.path() + "/learn", {{"max_steps", 40}, {"save_steps", 20}}),
                events),
      {}, absl::Minutes(10));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto all = ReadEvents(events);
  const auto losses = Losses(all);
  ASSERT_EQ(losses.size(), 40u);
  EXPECT_GT(losses.begin()->second, 9.0);  // ln(151936) ~ 11.9 at the start
  EXPECT_LT(losses.rbegin()->second, 2.5) << "step 40 loss";
  std::vector<int64_t> checkpoints;
  for (const json& e : all) {
    if (e["type"] == "checkpoint") checkpoints.push_back(e["step"]);
  }
  EXPECT_EQ(checkpoints, (std::vector<int64_t>{20, 40}));
  EXPECT_TRUE(fs::exists(dir_.path() + "/learn/checkpoint-40/manifest.json"));
  EXPECT_TRUE(fs::exists(dir_.path() + "/learn/checkpoint-40/model.safetensors"));
  EXPECT_EQ(all.back()["type"], "status");
  EXPECT_EQ(all.back()["state"], "succeeded");
  json first_metric;
  for (const json& e : all) {
    if (e["type"] == "metric" && first_metric.is_null()) first_metric = e;
  }
  for (const char* key :
       {"learning_rate", "grad_norm", "tokens_per_second", "samples_per_second", "step_time"}) {
    EXPECT_TRUE(first_metric["values"].contains(key)) << key;
  }
}

// packing: true through the real trainer: rows of max_seq_length tokens hold several samples
// each (the model keeps them apart), fewer rows carry the same samples, and the loss falls.
TEST_F(SftTest, PackedTrainingLearnsWithFewerRows) {
  const std::string events = dir_.path() + "/packed.jsonl";
  RunResult r = testing::Run(TrainArgs(WriteSpec("packed", dir_.path() + "/packed",
                                                 {{"max_steps", 12},
                                                  {"save_strategy", "no"},
                                                  {"per_device_train_batch_size", 1},
                                                  {"packing", true},
                                                  {"max_seq_length", 2048}}),
                                       events),
                             {}, absl::Minutes(10));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto all = ReadEvents(events);
  const auto losses = Losses(all);
  ASSERT_EQ(losses.size(), 12u);
  EXPECT_LT(losses.rbegin()->second, losses.begin()->second - 1.0);
  // One packed row per micro-batch carries several samples (a shapes sample is ~700 tokens):
  // more than the 2 rows of a step.
  for (const json& e : all) {
    if (e["type"] != "metric") continue;
    const double per_step =
        e["values"]["samples_per_second"].get<double>() * e["values"]["step_time"].get<double>();
    EXPECT_GT(per_step, 3.0) << e.dump();
    break;
  }
}

// Model FLOPs are logged with every metric; MFU only where the device's peak is known, which on a
// CPU means TRAINCTL_PEAK_FLOPS. A malformed override is a warning, not an error.
TEST_F(SftTest, LogsModelFlopsAndMfuAgainstThePeakGiven) {
  auto first_metric = [](const std::vector<json>& all) {
    for (const json& e : all) {
      if (e["type"] == "metric") return e["values"];
    }
    return json();
  };
  const std::string spec = WriteSpec("mfu", dir_.path() + "/mfu", {{"max_steps", 2}});
  RunResult r = testing::Run(TrainArgs(spec, dir_.path() + "/mfu.jsonl"),
                             {{"TRAINCTL_PEAK_FLOPS", "1e10"}}, absl::Minutes(5));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json values = first_metric(ReadEvents(dir_.path() + "/mfu.jsonl"));
  ASSERT_TRUE(values.contains("flops_per_second")) << values.dump();
  const double flops = values["flops_per_second"];
  EXPECT_GT(flops, 0);
  ASSERT_TRUE(values.contains("mfu")) << values.dump();
  EXPECT_DOUBLE_EQ(values["mfu"].get<double>(), flops / 1e10);

  const std::string bad = WriteSpec("nomfu", dir_.path() + "/nomfu", {{"max_steps", 1}});
  r = testing::Run(TrainArgs(bad, dir_.path() + "/nomfu.jsonl"), {{"TRAINCTL_PEAK_FLOPS", "fast"}},
                   absl::Minutes(5));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto all = ReadEvents(dir_.path() + "/nomfu.jsonl");
  EXPECT_FALSE(first_metric(all).contains("mfu"));
  bool warned = false;
  for (const json& e : all) {
    warned = warned || (e["type"] == "warning" &&
                        e["message"].get<std::string>().find("TRAINCTL_PEAK_FLOPS='fast'") !=
                            std::string::npos);
  }
  EXPECT_TRUE(warned);
}

TEST_F(SftTest, ResumeAfterAKillReproducesTheLossesExactly) {
  const json training = {{"max_steps", 8}};
  const std::string straight_events = dir_.path() + "/straight.jsonl";
  ASSERT_EQ(testing::Run(TrainArgs(WriteSpec("straight", dir_.path() + "/straight", training),
                                   straight_events),
                         {}, absl::Minutes(10))
                .exit_code,
            0);
  const auto straight = Losses(ReadEvents(straight_events));
  ASSERT_EQ(straight.size(), 8u);

  // Same job, killed once its step-4 checkpoint is complete, then started again.
  const std::string spec = WriteSpec("killed", dir_.path() + "/killed", training);
  const std::string second_events = dir_.path() + "/killed-2.jsonl";
  const auto events = testing::KillOnceAndResume(
      TrainArgs(spec, dir_.path() + "/killed-1.jsonl"), TrainArgs(spec, second_events),
      second_events, dir_.path() + "/killed/checkpoint-4", dir_.path() + "/killed/checkpoint-8",
      dir_.path() + "/killed-1.log");
  EXPECT_EQ(testing::ResumedFrom(events), 4);
  const auto after = Losses(events);
  ASSERT_EQ(after.size(), 4u);
  for (const auto& [step, loss] : after) {
    EXPECT_EQ(loss, straight.at(step)) << "step " << step;  // bit-identical on CPU, one thread
  }
}

TEST_F(SftTest, ACorruptLatestCheckpointFallsBackToThePreviousOne) {
  const std::string spec = WriteSpec("corrupt", dir_.path() + "/corrupt", {{"max_steps", 8}});
  ASSERT_EQ(
      testing::Run(TrainArgs(spec, dir_.path() + "/c1.jsonl"), {}, absl::Minutes(10)).exit_code, 0);
  const std::string weights = dir_.path() + "/corrupt/checkpoint-8/model.safetensors";
  {
    std::fstream f(weights, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(weights) / 2));
    f.put('\x7f');
  }
  const std::string events_path = dir_.path() + "/c2.jsonl";
  RunResult r = testing::Run(TrainArgs(spec, events_path), {}, absl::Minutes(10));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto events = ReadEvents(events_path);
  bool warned = false, resumed_from_4 = false;
  for (const json& e : events) {
    if (e["type"] == "warning" && e["message"].get<std::string>().find(
                                      "checkpoint-8/model.safetensors") != std::string::npos) {
      warned = true;
    }
    if (e["type"] == "status" && e["state"] == "resumed") resumed_from_4 = e["step"] == 4;
  }
  EXPECT_TRUE(warned) << testing::ReadFileOrEmpty(events_path);
  EXPECT_TRUE(resumed_from_4);
}

TEST_F(SftTest, MissingDataFailsWithAStatusNamingIt) {
  const json spec = {{"kind", "sft"},
                     {"model_name_or_path", "tiny"},
                     {"data_path", dir_.path() + "/nowhere"},
                     {"output_dir", dir_.path() + "/o"}};
  const std::string events_path = dir_.path() + "/bad.jsonl";
  RunResult r = testing::Run(TrainArgs(dir_.Write("bad.json", spec.dump()), events_path));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(dir_.path() + "/nowhere"), std::string::npos) << r.err;
  const auto events = ReadEvents(events_path);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["state"], "failed");
}

// The shards hold images resized at prepare time (the defaults here): a job asking for other
// min/max_pixels fails before training, naming the field and both values.
TEST_F(SftTest, PixelsOtherThanThePreparedShardsFailNamingTheField) {
  const std::string events_path = dir_.path() + "/pixels.jsonl";
  RunResult r = testing::Run(TrainArgs(
      WriteSpec("pixels", dir_.path() + "/pixels", {{"max_pixels", 401408}}), events_path));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("spec.training.max_pixels: 401408, but the shards in " + shards_ +
                       " were prepared with --max_pixels 12845056"),
            std::string::npos)
      << r.err;
  const auto events = ReadEvents(events_path);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["state"], "failed");
}

}  // namespace
}  // namespace trainctl
