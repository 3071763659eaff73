// Training tests over the real parts: the shapes dataset made by `trainctl datagen`, shards made
// by `trainctl prepare` with the real Qwen tokenizer, and the real trainctl-trainer binary on the
// tiny Qwen2-VL config, one process per rank.
#ifndef TRAINCTL_TESTS_TRAINER_SHAPES_FIXTURE_H_
#define TRAINCTL_TESTS_TRAINER_SHAPES_FIXTURE_H_

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/tokenizer/qwen_fixture.h"

namespace trainctl::testing {

inline std::vector<nlohmann::json> ReadEvents(const std::string& path) {
  std::vector<nlohmann::json> events;
  for (absl::string_view line : absl::StrSplit(ReadFileOrEmpty(path), '\n', absl::SkipEmpty())) {
    events.push_back(nlohmann::json::parse(line));
  }
  return events;
}

// step -> loss of the metric events (logging_steps 1 makes that every step's loss).
inline std::map<int64_t, double> Losses(const std::vector<nlohmann::json>& events) {
  std::map<int64_t, double> losses;
  for (const nlohmann::json& e : events) {
    if (e["type"] == "metric") losses[e["step"].get<int64_t>()] = e["values"]["loss"].get<double>();
  }
  return losses;
}

// A run killed with SIGKILL once `checkpoint` (a checkpoint directory) is complete, then started
// again with the same arguments after `stale` (a later checkpoint the kill may have let finish) is
// removed. Returns the second run's events (from `events` of the second run's arguments).
inline std::vector<nlohmann::json> KillOnceAndResume(const std::vector<std::string>& first,
                                                     const std::vector<std::string>& second,
                                                     const std::string& second_events,
                                                     const std::string& checkpoint,
                                                     const std::string& stale,
                                                     const std::string& log) {
  {
    Subprocess trainer(first, log);
    EXPECT_TRUE(WaitFor([&] { return std::filesystem::exists(checkpoint + "/manifest.json"); },
                        absl::Minutes(5)));
    trainer.Kill(SIGKILL);
    EXPECT_TRUE(trainer.Wait(absl::Seconds(30)).ok());
  }
  std::filesystem::remove_all(stale);
  RunResult resumed = Run(second, {}, absl::Minutes(10));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  return ReadEvents(second_events);
}

// Starts `world` ranks of `trainer train --spec SPEC --threads 1`, each with the launch
// environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT) and its events in `prefix`.<rank>.jsonl, its
// log in `prefix`.<rank>.log.
inline std::vector<std::unique_ptr<Subprocess>> LaunchRanks(int world, const std::string& trainer,
                                                            const std::string& spec,
                                                            const std::string& prefix) {
  const int port = FreeLoopbackPort();
  std::vector<std::unique_ptr<Subprocess>> procs;
  for (int r = 0; r < world; ++r) {
    procs.push_back(std::make_unique<Subprocess>(
        std::vector<std::string>{"/usr/bin/env", absl::StrCat("RANK=", r),
                                 absl::StrCat("LOCAL_RANK=", r), absl::StrCat("WORLD_SIZE=", world),
                                 "MASTER_ADDR=127.0.0.1", absl::StrCat("MASTER_PORT=", port),
                                 trainer, "train", "--spec", spec, "--events",
                                 absl::StrCat(prefix, ".", r, ".jsonl"), "--threads", "1"},
        absl::StrCat(prefix, ".", r, ".log")));
  }
  return procs;
}

// LaunchRanks, then waits for the end: every rank must exit 0 (a test failure with its log
// otherwise). Returns rank 0's events.
inline std::vector<nlohmann::json> TrainRanks(int world, const std::string& trainer,
                                              const std::string& spec, const std::string& prefix,
                                              absl::Duration timeout = absl::Minutes(15)) {
  std::vector<std::unique_ptr<Subprocess>> procs = LaunchRanks(world, trainer, spec, prefix);
  for (int r = 0; r < world; ++r) {
    auto code = procs[static_cast<size_t>(r)]->Wait(timeout);
    EXPECT_TRUE(code.ok() && *code == 0)
        << prefix << " rank " << r << ": " << ReadFileOrEmpty(absl::StrCat(prefix, ".", r, ".log"));
  }
  return ReadEvents(absl::StrCat(prefix, ".0.jsonl"));
}

// Every step's loss of `got` within `tolerance` (relative) of `reference`'s, the same steps; prints
// the largest difference.
inline void ExpectLossesClose(const std::map<int64_t, double>& reference,
                              const std::map<int64_t, double>& got, const std::string& what,
                              double tolerance = 1e-5) {
  ASSERT_EQ(got.size(), reference.size()) << what;
  double worst = 0;
  for (const auto& [step, loss] : reference) {
    ASSERT_TRUE(got.count(step)) << what << " step " << step;
    const double relative = std::abs(got.at(step) - loss) / std::abs(loss);
    worst = std::max(worst, relative);
    EXPECT_LE(relative, tolerance)
        << what << " step " << step << ": " << got.at(step) << " vs " << loss;
  }
  std::cout << what << ": largest relative loss difference over " << reference.size()
            << " steps: " << worst << "\n";
}

// The step of the run's `resumed` status event; -1 when it did not resume.
inline int64_t ResumedFrom(const std::vector<nlohmann::json>& events) {
  for (const nlohmann::json& e : events) {
    if (e["type"] == "status" && e.value("state", "") == "resumed") return e["step"].get<int64_t>();
  }
  return -1;
}

class ShapesTrainingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(tokenizer::testing::QwenFixturePresent());
    RunResult gen = testing::Run({TRAINCTL_CLI_BIN, "datagen", "shapes", "--out",
                                  dir_.path() + "/shapes", "--n", "32", "--seed", "1"});
    ASSERT_EQ(gen.exit_code, 0) << gen.err;
    RunResult prep =
        testing::Run({TRAINCTL_CLI_BIN, "prepare", "--input", dir_.path() + "/shapes/shapes.jsonl",
                      "--out", shards_, "--tokenizer", tokenizer::testing::QwenTokenizerDir()});
    ASSERT_EQ(prep.exit_code, 0) << prep.err;
  }

  // A spec for the tiny model on the shapes shards; `training` overrides the defaults below and
  // `extra` is merged into the spec (e.g. a deepspeed_config_json).
  std::string WriteSpec(const std::string& name, const std::string& output_dir,
                        nlohmann::json training, const nlohmann::json& extra = {}) {
    nlohmann::json t = {{"per_device_train_batch_size", 4},
                        {"gradient_accumulation_steps", 2},
                        {"learning_rate", 5e-3},
                        {"warmup_ratio", 0.1},
                        {"logging_steps", 1},
                        {"save_strategy", "steps"},
                        {"save_steps", 4},
                        {"seed", 7}};
    if (training.is_object()) t.update(training);
    nlohmann::json spec = {{"kind", "sft"},
                           {"name", name},
                           {"model_name_or_path", "tiny"},
                           {"data_path", shards_},
                           {"output_dir", output_dir},
                           {"training", t}};
    if (extra.is_object()) spec.update(extra);
    return dir_.Write(name + ".json", spec.dump());
  }

  std::vector<std::string> TrainArgs(const std::string& spec, const std::string& events) {
    return {TRAINCTL_TRAINER_BIN, "train", "--spec", spec, "--events", events, "--threads", "1"};
  }

  TempDir dir_;
  std::string shards_ = dir_.path() + "/shards";
};

}  // namespace trainctl::testing

#endif  // TRAINCTL_TESTS_TRAINER_SHAPES_FIXTURE_H_
